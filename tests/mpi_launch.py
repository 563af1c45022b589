"""How the Python tests launch moe_rt under mpiexec: --oversubscribe only when the ranks exceed the
cores, Open MPI's run-as-root variables only as root. moe_rt picks its threads per rank itself
(--threads, else the cores it may use / ranks on the node); OPENBLAS_NUM_THREADS=1 only keeps
OpenBLAS from starting threads of its own at load, which moe_rt never uses."""
import os

import pytest


def launcher(np_):
    cmd = ["mpiexec", "-n", str(np_)]
    if np_ > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    return cmd


def mpmd_launcher(commands):
    """One rank per command: `mpiexec -n 1 CMD1 : -n 1 CMD2 ...`."""
    cmd = ["mpiexec"]
    if len(commands) > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    for i, command in enumerate(commands):
        cmd += ([":"] if i else []) + ["-n", "1"] + list(command)
    return cmd


def run_env():
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


@pytest.fixture(scope="session")
def moe_rt_bin():
    """The moe_rt binary under test: $MOE_RT_BIN, which CTest sets."""
    path = os.environ.get("MOE_RT_BIN")
    if not path or not os.path.exists(path):
        pytest.fail("MOE_RT_BIN must name the built moe_rt binary (CTest sets it)")
    return path

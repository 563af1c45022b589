"""Shared fixtures for the command-line tests: how to launch moe_rt under mpiexec."""
import os
import subprocess

import pytest


def launcher(np_):
    cmd = ["mpiexec", "-n", str(np_)]
    if np_ > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    return cmd


def run_env():
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


@pytest.fixture(scope="session")
def moe_rt_bin():
    path = os.environ.get("MOE_RT_BIN")
    if not path or not os.path.exists(path):
        pytest.fail("MOE_RT_BIN must name the built moe_rt binary (CTest sets it)")
    return path


@pytest.fixture
def run_moe(moe_rt_bin):
    """Runs moe_rt on np ranks with a time limit; a hang is a test failure, not a stuck suite."""

    def run(args, np_=2, timeout=120, cwd=None):
        try:
            return subprocess.run(launcher(np_) + [moe_rt_bin] + list(args), cwd=cwd,
                                  env=run_env(), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"moe_rt {' '.join(args)} hung for more than {timeout} s")

    return run

"""Shared fixtures for the command-line tests: how to launch moe_rt under mpiexec."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_launch import launcher, moe_rt_bin, mpmd_launcher, run_env  # noqa: E402,F401


def moe_run(moe_rt_bin, args, np_=2, timeout=120, cwd=None):
    """Runs moe_rt on np ranks (arguments as text) with a time limit; a hang is a test failure,
    not a stuck suite. For fixtures of any scope; tests take run_moe."""
    args = [str(a) for a in args]
    try:
        return subprocess.run(launcher(np_) + [moe_rt_bin] + args, cwd=cwd, env=quick_exit_env(),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"moe_rt {' '.join(args)} hung for more than {timeout} s")


@pytest.fixture
def run_moe(moe_rt_bin):
    """moe_run with the binary under test."""

    def run(args, np_=2, timeout=120, cwd=None):
        return moe_run(moe_rt_bin, args, np_, timeout, cwd)

    return run


def quick_exit_env():
    """run_env, with mpirun's grace time before it kills the rest of a job whose rank exited
    non-zero set to 0: by default mpirun waits 2 s at the end of every failing run (bad input: the
    ranks agree and all exit 2 together, through MPI_Finalize's fence). Only for runs the test
    does not signal: mpirun's SIGTERM to the ranks is followed by SIGKILL after the same grace."""
    env = run_env()
    env.setdefault("OMPI_MCA_odls_base_sigkill_timeout", "0")
    return env


@pytest.fixture
def run_moe_mpmd(moe_rt_bin):
    """Runs moe_rt as an MPMD job, one rank per argument list (`mpiexec -n 1 moe_rt A : -n 1
    moe_rt B`), so that ranks are given different options; with a time limit, as run_moe."""

    def run(arg_lists, timeout=120, cwd=None):
        cmd = mpmd_launcher([[moe_rt_bin] + list(args) for args in arg_lists])
        try:
            return subprocess.run(cmd, cwd=cwd, env=quick_exit_env(), capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(cmd)} hung for more than {timeout} s")

    return run

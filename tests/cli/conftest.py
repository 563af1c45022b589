"""Shared fixtures for the command-line tests: how to launch moe_rt under mpiexec."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_launch import launcher, moe_rt_bin, mpmd_launcher, run_env  # noqa: E402,F401


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


@pytest.fixture
def run_moe_mpmd(moe_rt_bin):
    """Runs moe_rt as an MPMD job, one rank per argument list (`mpiexec -n 1 moe_rt A : -n 1
    moe_rt B`), so that ranks are given different options; with a time limit, as run_moe."""

    def run(arg_lists, timeout=120, cwd=None):
        cmd = mpmd_launcher([[moe_rt_bin] + list(args) for args in arg_lists])
        try:
            return subprocess.run(cmd, cwd=cwd, env=run_env(), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(cmd)} hung for more than {timeout} s")

    return run

"""Shared fixtures for the tests of scripts/moe_stats.py: the script as a module, the fixture
runs A and B of stats_fixture.py, and an in-process command line returning (code, out, err)."""
import io
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import moe_stats  # noqa: E402
import stats_fixture  # noqa: E402


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """(path of run A, path of run B), written once per session."""
    return stats_fixture.write_example(str(tmp_path_factory.mktemp("runs")))


@pytest.fixture
def run_a(runs):
    return runs[0]


@pytest.fixture
def run_b(runs):
    return runs[1]


@pytest.fixture
def cli():
    """moe_stats.main(argv) in this process: (exit code, stdout text, stderr text)."""

    def call(*argv):
        out, err = io.StringIO(), io.StringIO()
        code = moe_stats.main([str(a) for a in argv], out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    return call


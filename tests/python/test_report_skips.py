"""tests/report_skips.py, the wrapper through which CTest runs every test command: a run that
passes with a skipped test (GoogleTest or pytest) exits 77, CTest's "Not Run (Skipped)"; a failure
next to a skip still fails; a run without skips keeps its status."""
import os
import subprocess
import sys

import pytest

WRAPPER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "report_skips.py")
GTEST_SKIP = "[ RUN      ] Simd.Avx512\n[  SKIPPED ] Simd.Avx512 (0 ms)\n[  PASSED  ] 4 tests.\n" \
             "[  SKIPPED ] 1 test, listed below:\n"
GTEST_PASS = "[ RUN      ] Ops.Add\n[       OK ] Ops.Add (0 ms)\n[  PASSED  ] 5 tests.\n"
GTEST_COLOUR = "\x1b[0;32m[ RUN      ] \x1b[mSimd.Avx512\ntest_simd.cpp:25: Skipped\n" \
               "\x1b[0;32m[  SKIPPED ] \x1b[mSimd.Avx512 (0 ms)\n"
PYTEST_SKIP = "..s\nSKIPPED [1] test_x.py:3: no pyarrow\n2 passed, 1 skipped in 0.12s\n"
PYTEST_MIXED = "F.s\n1 failed, 1 passed, 1 skipped in 0.12s\n"
PYTEST_PASS = "...\n3 passed in 0.12s\n"


def wrapped(output, code):
    script = f"import sys; sys.stdout.write({output!r}); sys.exit({code})"
    return subprocess.run([sys.executable, WRAPPER, "--", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("output, code, expected", [
    (GTEST_SKIP, 0, 77), (GTEST_SKIP, 1, 1), (GTEST_COLOUR, 0, 77), (GTEST_COLOUR, 1, 1), (GTEST_PASS, 0, 0), (GTEST_PASS, 1, 1),
    (PYTEST_SKIP, 0, 77), (PYTEST_MIXED, 1, 1), (PYTEST_PASS, 0, 0), ("", 77, 77),
])
def test_a_skip_is_77_and_a_failure_stays_a_failure(output, code, expected):
    proc = wrapped(output, code)
    assert proc.returncode == expected
    assert proc.stdout == output            # passed through whole


def test_a_command_ended_by_a_signal_is_128_plus_n():
    proc = subprocess.run([sys.executable, WRAPPER, "--", "sh", "-c", "kill -TERM $$"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + 15


def test_a_command_that_cannot_start_is_one_line():
    proc = subprocess.run([sys.executable, WRAPPER, "--", "/nonexistent/binary"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == "report_skips.py: cannot run /nonexistent/binary: No such file or " \
                          "directory\n"

#!/usr/bin/env python3
"""Runs a test command for CTest and reports its skipped tests as a skipped CTest entry.

    report_skips.py -- COMMAND [ARG...]

The command's output is passed through as it comes. When the command succeeds (exit 0) and its
output shows a skipped test (GoogleTest's "[  SKIPPED ]" marker, or pytest's summary line
"N skipped"), this exits SKIP_CODE, which CTest (SKIP_RETURN_CODE) shows as "Not Run (Skipped)".
Any other exit status is passed on unchanged, so a failure next to a skip still fails.

Why a wrapper rather than CTest's SKIP_REGULAR_EXPRESSION: CTest lets a skip pattern that matches
win over a failing exit status, so a suite with one skipped and one failed test would be reported
as skipped, its failure hidden.
"""
import re
import signal
import subprocess
import sys

SKIP_CODE = 77
SKIP_MARKERS = re.compile(rb"^\[  SKIPPED \] |^=*\s*(?:\d+ \w+, )*\d+ skipped\b")
# Colour codes, stripped before matching: mpiexec gives a rank's output a terminal, so GoogleTest
# colours its markers ("\x1b[0;32m[  SKIPPED ] \x1b[m...").
COLOUR = re.compile(rb"\x1b\[[0-9;]*m")


def main(argv):
    if len(argv) < 2 or argv[0] != "--":
        print("usage: report_skips.py -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    try:
        child = subprocess.Popen(argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as err:
        print(f"report_skips.py: cannot run {argv[1]}: {err.strerror}", file=sys.stderr)
        return 2
    # CTest ends a test past its TIMEOUT with SIGTERM (then SIGKILL): pass it on to the command.
    signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    skipped = False
    for line in child.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
        skipped = skipped or SKIP_MARKERS.search(COLOUR.sub(b"", line)) is not None
    code = child.wait()
    if code < 0:                     # ended by a signal: the shell's 128 + N
        return 128 - code
    return SKIP_CODE if code == 0 and skipped else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What a run wrote, read in tests: its statistics file, live or of a killed writer
(docs/hdf5-schema.md, "Crash safety and live reading"), and rank 0's step lines. Shared by the
command-line and the multi-host tests."""
import time

import h5py
import pytest


def open_stats(path):
    """The file opened as SWMR readers open it: also while a run writes it, or after a kill."""
    return h5py.File(path, "r", libver="latest", swmr=True)


def complete_rows(f):
    """Rows whose /steps/step is written (the step column is written last)."""
    steps = f["/steps/step"][...]
    n = len(steps)
    while n and steps[n - 1] < 0:
        n -= 1
    return n


def wait_for_rows(path, rows, job, limit=120):
    """Waits until the live file at `path` holds `rows` complete rows, while `job` (a Popen) runs;
    fails the test after `limit` seconds or when the job ends first."""
    deadline = time.time() + limit
    while time.time() < deadline and job.poll() is None:
        time.sleep(0.2)
        try:
            with open_stats(path) as f:
                if complete_rows(f) >= rows:
                    return
        except (OSError, KeyError):
            continue  # being created
    pytest.fail(f"{path} did not reach {rows} rows (job status {job.poll()})")


def step_lines(text):
    """(step, loss) of rank 0's step lines."""
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 9 and parts[0].isdigit():  # ... max_viol eta
            rows.append((int(parts[0]), float(parts[1])))
    return rows


def checkpoint_arrays(path):
    """{name: array} of every dataset of an HDF5 file (a checkpoint), for comparing two bit for
    bit."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...])
                     if isinstance(obj, h5py.Dataset) else None)
    return out

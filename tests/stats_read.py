"""Reading a statistics file in tests, live or of a killed writer (docs/hdf5-schema.md, "Crash
safety and live reading"): shared by the command-line and the multi-host tests."""
import h5py


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

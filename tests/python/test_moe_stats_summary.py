"""`moe_stats.py summary` and reading: the key facts of a run, string attributes stored as str or
bytes, a file still being written (incomplete rows, SWMR), the script run as a program."""
import ctypes
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import moe_stats
import stats_fixture as sf

SCRIPT = os.path.abspath(moe_stats.__file__)


def line_of(out, key):
    return next(l for l in out.splitlines() if l.startswith(key + " "))


def test_summary_has_the_key_facts(cli, run_a):
    code, out, err = cli("summary", run_a)
    assert code == 0, err
    with h5py.File(run_a, "r") as f:
        loss = f["steps/loss"][:]
        tokens_per_s = f["steps/tokens_per_s"][:]
    assert "micro" in line_of(out, "model")
    assert "2 (EP group 2)" in line_of(out, "ranks")
    assert "1234" in line_of(out, "seed")
    assert "synthetic" in line_of(out, "data")
    assert "6 layers (2 hash, 4 top-k), 4 experts, top-k 2" in line_of(out, "shape")
    assert "bias-update-rate = 0" in line_of(out, "config")
    assert "21 (step 0 .. 20)" in line_of(out, "steps")
    loss_line = line_of(out, "loss")
    assert f"first {loss[0]:.4f}" in loss_line and f"last {loss[-1]:.4f}" in loss_line
    assert f"min {loss.min():.4f} at step {int(np.argmin(loss))}" in loss_line
    assert "entropy floor 1.6316" in loss_line
    assert f"{np.median(tokens_per_s[1:]):.0f}" in line_of(out, "tokens/s")


def test_summary_per_layer_balance(cli, run_b):
    code, out, _ = cli("summary", run_b)
    assert code == 0
    with h5py.File(run_b, "r") as f:
        var = f["routing/load_variance"][:]
        viol = f["routing/max_violation"][:]
        over = f["routing/rank_overload"][:]
    lines = out.splitlines()
    header = next(i for i, l in enumerate(lines) if l.startswith("layer "))
    assert lines[header].split() == ["layer", "routing", "mean", "var", "last", "var", "last",
                                     "max", "viol", "last", "rank", "overload"]
    for layer in range(sf.NUM_LAYERS):
        cells = lines[header + 1 + layer].split()
        kind = "Hash" if layer < sf.NUM_HASH else "Top-K"
        assert cells[:3] == [str(layer), kind, "Routed"]
        assert cells[3:] == [f"{var[:, layer].mean():.2f}", f"{var[-1, layer]:.2f}",
                             f"{viol[-1, layer]:.3f}", f"{over[-1, layer]:.3f}"]


def test_unknown_entropy_floor(cli, tmp_path):
    path = sf.write_stats(str(tmp_path / "nofloor.h5"), sf.build_run("A"),
                          attrs={"entropy_floor": float("nan")})
    code, out, _ = cli("summary", path)
    assert code == 0 and "entropy floor unknown" in line_of(out, "loss")


def test_byte_strings_read_like_str(cli, run_a, run_b):
    # run B stores every string attribute and dataset as fixed-length bytes, run A as str.
    with h5py.File(run_b, "r") as f:
        assert isinstance(f.attrs["format"], bytes)
    out_a, out_b = cli("summary", run_a)[1], cli("summary", run_b)[1]
    assert line_of(out_a, "model") == line_of(out_b, "model")
    assert "Top-K Routed" in out_b and "Hash Routed" in out_b


@pytest.mark.parametrize("libver", ["earliest", ("v110", "v110"), "latest"])
def test_reads_every_hdf5_file_format_version(cli, tmp_path, libver):
    path = sf.write_stats(str(tmp_path / "run.h5"), sf.build_run("A"), libver=libver)
    code, out, err = cli("variance", path, "--steps", "0,20")
    assert code == 0, err
    assert "80.00" in out


def test_incomplete_last_row_is_not_counted(cli, tmp_path):
    path = sf.write_stats(str(tmp_path / "midstep.h5"), sf.build_run("A"),
                          lengths={"routing/expert_load": 20, "routing/bias": 20})
    code, out, err = cli("summary", path)
    assert code == 0, err
    assert "20 (step 0 .. 19)" in line_of(out, "steps")


def test_row_with_unwritten_step_is_not_counted(cli, tmp_path):
    # The writer extends /steps/step with fill value -1 and writes the step last.
    run = sf.build_run("A")
    run["datasets"]["steps/step"] = run["datasets"]["steps/step"].copy()
    run["datasets"]["steps/step"][-1] = -1
    path = sf.write_stats(str(tmp_path / "unwritten.h5"), run)
    code, out, err = cli("summary", path)
    assert code == 0, err
    assert "20 (step 0 .. 19)" in line_of(out, "steps")


def test_reads_a_file_open_for_swmr_writing(cli, tmp_path):
    path = str(tmp_path / "live.h5")
    writer = subprocess.Popen([sys.executable, sf.__file__, "swmr-writer", path, "5"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        code, out, err = cli("summary", path)
        assert code == 0, err
        # The writer appended a sixth row to /steps/* only: not a complete step.
        assert "5 (step 0 .. 4)" in line_of(out, "steps")
        code, out, err = cli("variance", path, "--steps", "0,4")
        assert code == 0, err
    finally:
        writer.communicate("done\n", timeout=30)
    assert writer.returncode == 0


def test_damaged_file_of_a_killed_writer_is_an_error_not_a_hang(tmp_path):
    # A writer killed while its file is open for SWMR writing, then one dataset header damaged:
    # HDF5's SWMR reader would retry its checksum for ever (100 attempts, doubling sleeps).
    path = str(tmp_path / "killed.h5")
    writer = subprocess.Popen([sys.executable, sf.__file__, "swmr-writer", path, "5"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "ready"
    with moe_stats.open_swmr(path) as f:
        group = f["routing"]
        header = group.id.links.get_info(b"expert_load").u  # the dataset's object header
    writer.kill()
    writer.communicate(timeout=30)
    with open(path, "r+b") as f:
        f.seek(header + 16)
        f.write(b"\xff" * 8)
    proc = subprocess.run([sys.executable, SCRIPT, "summary", path], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and "truncated or damaged" in proc.stderr, proc.stderr


def test_swmr_reads_bound_the_metadata_read_attempts(tmp_path):
    # No public interface sets the bound (stats_file.py says why), so the ctypes route is checked
    # against the installed h5py: the library reached is h5py's own, and a file opened by
    # open_swmr really reads with the bound, as HDF5 itself reports it.
    assert not hasattr(h5py.h5p.PropFAID, "set_metadata_read_attempts"), \
        "h5py now has a public call for the bound: use it instead of ctypes"
    lib = moe_stats.hdf5_library()
    assert lib is not None, "h5py's HDF5 library was not reachable through ctypes"
    version = [ctypes.c_uint(0) for _ in range(3)]
    assert lib.H5get_libversion(*[ctypes.byref(v) for v in version]) >= 0
    assert tuple(v.value for v in version) == h5py.version.hdf5_version_tuple[:3]
    fapl = moe_stats.swmr_fapl()
    attempts = ctypes.c_uint(0)
    assert lib.H5Pget_metadata_read_attempts(fapl.id, ctypes.byref(attempts)) >= 0
    assert attempts.value == moe_stats.SWMR_READ_ATTEMPTS == 20
    path = str(tmp_path / "live.h5")
    writer = subprocess.Popen([sys.executable, sf.__file__, "swmr-writer", path, "2"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        with moe_stats.open_swmr(path) as f:
            used = f.id.get_access_plist()
            attempts = ctypes.c_uint(0)
            assert lib.H5Pget_metadata_read_attempts(used.id, ctypes.byref(attempts)) >= 0
            assert attempts.value == 20
    finally:
        writer.communicate("done\n", timeout=30)


def test_script_runs_as_a_program(run_a):
    assert os.access(SCRIPT, os.X_OK)
    with open(SCRIPT) as f:
        assert f.readline().strip() == "#!/usr/bin/env python3"
    proc = subprocess.run([SCRIPT, "summary", run_a], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "micro" in proc.stdout


def test_help_lists_the_subcommands():
    proc = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    for word in ("summary", "variance", "plot"):
        assert word in proc.stdout

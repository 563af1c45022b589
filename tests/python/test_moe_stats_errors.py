"""Bad statistics files: every subcommand ends with one line on stderr naming the file and exit
code 2, whichever of run A or run B is bad."""
import os
import subprocess
import sys

import h5py
import pytest

import moe_stats
import stats_fixture as sf


def missing(path):
    return path


def not_hdf5(path):
    with open(path, "w") as f:
        f.write("step,loss\n0,4.1\n")
    return path


def no_format(path):
    return sf.write_stats(path, sf.build_run("A"), drop=("format",))


def other_format(path):
    return sf.write_stats(path, sf.build_run("A"), attrs={"format": "maxtext.metrics"})


def newer_version(path):
    return sf.write_stats(path, sf.build_run("A"), attrs={"format_version": 3})


def empty(path):
    return sf.write_stats(path, sf.build_run("A"), rows=0)


def missing_dataset(path):
    return sf.write_stats(path, sf.build_run("A"), drop=("routing/expert_load",))


def plain_hdf5(path):
    with h5py.File(path, "w") as f:
        f["x"] = [1, 2, 3]
    return path


def truncated(path):
    """A closed file cut short (a copy interrupted): HDF5's SWMR reader used to retry it for ever."""
    whole = sf.write_stats(path + ".whole", sf.build_run("A"))
    with open(whole, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    return path


def with_dataset(name, data):
    """A moe_rt.stats file whose `name` is replaced by `data` (None: by a group)."""
    def make(path):
        sf.write_stats(path, sf.build_run("A"))
        with h5py.File(path, "a") as f:
            del f[name]
            if data is None:
                f.create_group(name)
            else:
                f[name] = data
        return path
    return make


def missing_predecessor(path):
    return sf.write_stats(path, sf.build_run("A"),
                          attrs=sf.resume_attrs(path + ".gone.h5", 0))


def resume_source_alone(path):
    # resumed_from_step alone is a run resumed from one without statistics (--stats none).
    return sf.write_stats(path, sf.build_run("A"), attrs={"resumed_from": path + ".0.h5"})


def negative_resume_step(path):
    return sf.write_stats(path, sf.build_run("A"),
                          attrs={"resumed_from": path + ".0.h5", "resumed_from_step": -3})


def nan_version(path):
    return sf.write_stats(path, sf.build_run("A"), attrs={"format_version": float("nan")})


CASES = {
    "missing": (missing, ["no such file"]),
    "not_hdf5": (not_hdf5, ["not an HDF5 file"]),
    "no_format": (no_format, ["not a moe_rt statistics file", "no 'format' attribute"]),
    "plain_hdf5": (plain_hdf5, ["not a moe_rt statistics file"]),
    "other_format": (other_format, ["not a moe_rt statistics file", "maxtext.metrics"]),
    "newer_version": (newer_version, ["format_version 3", "supports (version 2)"]),
    "empty": (empty, ["empty statistics file", "no complete steps"]),
    "missing_dataset": (missing_dataset, ["/routing/expert_load"]),
    "truncated": (truncated, ["truncated file"]),
    "nan_version": (nan_version, ["no integer 'format_version'"]),
    "missing_predecessor": (missing_predecessor, ["predecessor", "not found", "--no-chain"]),
    "resume_source_alone": (resume_source_alone, ["resumed_from without resumed_from_step"]),
    "negative_resume_step": (negative_resume_step, ["resumed_from_step is -3"]),
    "load_is_a_group": (with_dataset("routing/expert_load", None),
                        ["/routing/expert_load is not a dataset"]),
    "load_is_1d": (with_dataset("routing/expert_load", list(range(sf.NUM_STEPS))),
                   ["/routing/expert_load has 1 dimensions, expected 3"]),
    "variance_too_narrow": (with_dataset("routing/load_variance",
                                         [[1.0, 2.0]] * sf.NUM_STEPS),
                            ["/routing/load_variance has row shape (2,)"]),
    "routing_not_names": (with_dataset("layers/routing", list(range(sf.NUM_LAYERS))),
                          ["/layers/routing holds", "expected hash, topk, forced"]),
}


def command_lines(bad, good, tmp_path):
    return {
        "summary": ["summary", bad],
        "variance": ["variance", bad, "--steps", "0,20"],
        "variance_b": ["variance", good, bad, "--steps", "0,20"],
        "plot": ["plot", bad, "--out", str(tmp_path / "figures")],
        "plot_b": ["plot", good, bad, "--out", str(tmp_path / "figures")],
        "shadows": ["shadows", bad],
        "placement": ["placement", bad, "--ranks", "2", "--out", str(tmp_path / "figures")],
    }


@pytest.mark.parametrize("command", ["summary", "variance", "variance_b", "plot", "plot_b",
                                     "shadows", "placement"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_file_is_one_clear_line_and_exit_2(cli, run_a, tmp_path, case, command):
    make, words = CASES[case]
    bad = make(str(tmp_path / f"{case}.h5"))
    code, out, err = cli(*command_lines(bad, run_a, tmp_path)[command])
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("moe_stats.py: error: ")
    assert bad in lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert not os.path.exists(tmp_path / "figures") or not os.listdir(tmp_path / "figures")


def test_exit_code_of_the_program(tmp_path):
    bad = newer_version(str(tmp_path / "v3.h5"))
    proc = subprocess.run([sys.executable, moe_stats.__file__, "summary", bad],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0
    assert bad in proc.stderr and "version 2" in proc.stderr and "format_version 3" in proc.stderr


def test_usage_errors_exit_2(cli):
    with pytest.raises(SystemExit) as info:
        cli("variance")
    assert info.value.code == 2

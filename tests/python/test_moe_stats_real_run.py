"""moe_stats.py on a statistics file written by the real program: 3 steps of the micro model on
2 ranks. Needs MOE_RT_BIN (the built moe_rt binary); skipped without it."""
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mpi_launch import launcher, run_env  # noqa: E402  (tests/mpi_launch.py, shared)

RANKS = 2


def mpiexec_command(binary, stats_path):
    return launcher(RANKS) + [binary, "--model", "micro", "--steps", "3", "--stats", stats_path]


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    binary = os.environ.get("MOE_RT_BIN")
    if not binary:
        pytest.skip("MOE_RT_BIN is not set: point it at the built moe_rt to test a real run")
    path = str(tmp_path_factory.mktemp("real") / "run.h5")
    try:
        proc = subprocess.run(mpiexec_command(binary, path), env=run_env(), capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("moe_rt --model micro --steps 3 hung for more than 300 s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.path.exists(path), f"moe_rt did not write {path}\n{proc.stdout}"
    return path


def test_summary_and_variance_of_a_real_run(cli, real_run):
    code, out, err = cli("summary", real_run)
    assert code == 0, err
    assert "micro" in out and "3 (step 0 .. 2)" in out
    code, out, err = cli("variance", real_run, "--steps", "0,2", "--csv")
    assert code == 0, err
    assert "warning" not in err, err   # stored load_variance agrees with expert_load
    rows = out.splitlines()
    with h5py.File(real_run, "r") as f:
        load = f["routing/expert_load"][:].astype(np.float64)
        routing = f["layers/routing"][:]
    assert len(rows) == 1 + len(routing) + 1   # header, one per layer, TOTAL
    for layer, row in enumerate(rows[1:-1]):
        cells = row.split(",")
        assert float(cells[2]) == pytest.approx(load[0, layer].var())
        assert float(cells[3]) == pytest.approx(load[2, layer].var())
    code, out, err = cli("variance", real_run, real_run, "--steps", "0,2")
    assert code == 0, err
    assert out.splitlines()[-1].split()[-1] == "0.00%"   # a run against itself


def test_the_file_describes_itself_to_h5py(real_run):
    """Format version 2: units and a description on every dataset, named axes (dimension scales),
    the step axis's scale as long as the rows, the configuration as typed attributes."""
    with h5py.File(real_run, "r") as f:
        assert f.attrs["format_version"] == 2
        datasets = []
        f.visititems(lambda name, obj: datasets.append(name)
                     if isinstance(obj, h5py.Dataset) else None)
        for name in datasets:
            assert f[name].attrs["units"] and f[name].attrs["description"], name
        load = f["routing/expert_load"]
        assert [dim.label for dim in load.dims] == ["step", "layer", "expert"]
        step_scale = load.dims[0][0]
        assert step_scale.name == "/steps/step" and step_scale.shape[0] == load.shape[0]
        assert list(load.dims[2][0][:]) == list(range(load.shape[2]))
        phases = f["perf/phase_time"].dims[2][0]
        assert phases.name == "/perf/phases" and "router" in list(phases.asstr()[:])
        assert [dim.label for dim in f["routing/rank_load"].dims] == ["step", "layer", "rank"]
        config = f["config"].attrs
        assert config["model"] == "micro" and config["steps"] == 3
        assert isinstance(config["steps"], np.int64) and isinstance(config["lr"], np.float64)
        assert isinstance(config["overwrite"], np.bool_)
        assert config["lr"] == pytest.approx(0.003)
        # Typed by the option, not by how the value reads: a real whose value is whole stays real.
        assert isinstance(config["grad-clip"], np.float64) and config["grad-clip"] == 1.0
        assert isinstance(config["seed"], np.uint64)


def test_traces_of_a_real_run_measure_where_the_bias_changes_the_choice(cli, tmp_path):
    # A strong bias (rate 0.05) pulls the top-k layers' choice away from the scores' own top-k:
    # the agreement starts at 1 (the bias is 0 at step 0) and falls; hash layers keep 1.
    binary = os.environ.get("MOE_RT_BIN")
    if not binary:
        pytest.skip("MOE_RT_BIN is not set: point it at the built moe_rt to test a real run")
    path = str(tmp_path / "traced.h5")
    command = launcher(RANKS) + [binary, "--model", "micro", "--steps", "41", "--stats", path,
                                 "--trace-every", "20", "--bias-update-rate", "0.05"]
    proc = subprocess.run(command, env=run_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(path, "r") as f:
        chosen, unbiased = f["trace/experts"][...], f["trace/experts_unbiased"][...]
        routing = list(f["layers/routing"].asstr()[...])
    assert chosen.shape == unbiased.shape == (3, 3, RANKS * 16, 2)
    for layer, kind in enumerate(routing):
        same = np.all(np.sort(chosen[:, layer], axis=2) == np.sort(unbiased[:, layer], axis=2),
                      axis=2).mean(axis=1)
        assert same[0] == 1.0, (layer, same)
        if kind == "topk":
            assert same[-1] < 1.0, (layer, same)
        else:
            assert (same == 1.0).all(), (layer, same)
    code, out, err = cli("traces", path)
    assert code == 0, err
    assert "top-k with and without the bias" in out and "not computable" not in out

"""`moe_stats.py export`: tidy tables that pandas.read_csv and pandas.read_parquet load as they
are, equal to the file's arrays; a resumed run exported whole."""
import os

import numpy as np
import pytest

import moe_stats
import stats_fixture as sf

pd = pytest.importorskip("pandas")

ROWS = {"steps": sf.NUM_STEPS, "layers": sf.NUM_STEPS * sf.NUM_LAYERS,
        "loads": sf.NUM_STEPS * sf.NUM_LAYERS * sf.NUM_EXPERTS,
        "bias": sf.NUM_STEPS * sf.NUM_LAYERS * sf.NUM_EXPERTS,
        "ranks": sf.NUM_STEPS * sf.NUM_LAYERS * sf.WORLD,
        "phases": sf.NUM_STEPS * sf.WORLD * len(sf.PHASES),
        "shadow_violation": sf.NUM_STEPS * (1 + len(sf.SHADOW_RULES)) * (sf.NUM_LAYERS
                                                                          - sf.NUM_HASH)}


def read(path):
    return pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    run = sf.build_run("B", shadows=sf.SHADOW_RULES)   # every table, shadow_violation too
    path = str(tmp_path_factory.mktemp("traced") / "traced.h5")
    return sf.write_stats(path, run, traces=sf.build_traces(run))


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_every_table_loads_as_it_is(cli, traced, tmp_path, fmt):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    code, out, err = cli("export", traced, "--format", fmt, "-o", tmp_path / "out")
    assert code == 0, err
    paths = out.split()
    assert [os.path.basename(p) for p in paths] == [f"{t}.{fmt}" for t in
                                                    moe_stats._export.TABLES]
    tables = {os.path.basename(p).split(".")[0]: read(p) for p in paths}
    for name, rows in ROWS.items():
        assert len(tables[name]) == rows, name
    run = moe_stats.load_run(traced)
    loads = tables["loads"].sort_values(["step", "layer", "expert"])
    assert np.array_equal(loads["load"].to_numpy().reshape(run.data["routing/expert_load"].shape),
                          run.data["routing/expert_load"])
    assert list(loads.columns) == ["step", "layer", "routing", "expert", "load", "load_ratio"]
    assert set(loads["routing"].astype(str)) == {"hash", "topk"}
    assert loads["load_ratio"].to_numpy().reshape(-1, 4).mean(axis=1) == pytest.approx(1.0)
    steps = tables["steps"]
    assert steps["loss"].tolist() == run.data["steps/loss"].tolist()    # full precision
    assert steps["file"].unique().tolist() == ["traced.h5"]
    bias = tables["bias"]
    assert np.array_equal(bias["bias"].to_numpy().reshape(run.data["routing/bias"].shape),
                          run.data["routing/bias"].astype(np.float64))
    layers = tables["layers"]
    assert layers["cv"].to_numpy().reshape(sf.NUM_STEPS, sf.NUM_LAYERS) == pytest.approx(
        run.data["routing/load_cv"])
    ranks = tables["ranks"]
    assert np.array_equal(ranks["load"].to_numpy().reshape(run.data["routing/rank_load"].shape),
                          run.data["routing/rank_load"])
    phases = tables["phases"]
    assert list(phases["phase"].astype(str).unique()) == list(sf.PHASES)
    traces = tables["traces"]
    assert len(traces) == 5 * sf.NUM_LAYERS * sf.TOKENS * sf.TOP_K
    first = traces[(traces.step == 10) & (traces.layer == 2) & (traces.token == 7)]
    tid = int(first["token_id"].iloc[0])
    assert sorted(first["expert"]) == sorted([(tid + 3) % 4, (tid + 4) % 4])


def test_one_csv_table_on_stdout(cli, run_a, tmp_path):
    code, out, err = cli("export", run_a, "--format", "csv", "--what", "steps")
    assert code == 0, err
    path = tmp_path / "steps.csv"
    path.write_text(out)
    frame = pd.read_csv(path)
    assert list(frame.columns) == ["step", "file", "loss", "balance_loss", "grad_norm", "lr",
                                   "tokens_per_s", "step_time_s"]
    assert frame["step"].tolist() == list(range(sf.NUM_STEPS))


def test_one_table_to_a_file(cli, run_a, tmp_path):
    code, out, err = cli("export", run_a, "--format", "csv", "--what", "loads",
                         "-o", tmp_path / "loads.csv")
    assert code == 0, err
    assert out.strip() == str(tmp_path / "loads.csv")
    assert len(pd.read_csv(out.strip())) == ROWS["loads"]


def test_a_resumed_run_is_exported_whole(cli, tmp_path):
    # 0..11 on 2 ranks (resumed from step 9), then 10..20 on 4 ranks.
    run = sf.build_run("A")
    first = sf.write_segment(str(tmp_path / "a.h5"), run, 0, 12)
    last = sf.write_segment(str(tmp_path / "b.h5"), sf.with_world(run, 4), 10, 21,
                            predecessor=first, step=9)
    code, out, err = cli("export", last, "--format", "csv", "--what", "steps,ranks",
                         "-o", tmp_path / "out")
    assert code == 0, err
    steps = pd.read_csv(tmp_path / "out" / "steps.csv")
    assert steps["step"].tolist() == list(range(sf.NUM_STEPS))
    assert steps["file"].tolist() == ["a.h5"] * 10 + ["b.h5"] * 11
    ranks = pd.read_csv(tmp_path / "out" / "ranks.csv")
    per_step = ranks.groupby("step")["rank"].nunique()
    assert per_step.loc[:9].eq(2).all() and per_step.loc[10:].eq(4).all()
    assert ranks["load"].dtype == np.int64


def test_export_errors(cli, run_a, tmp_path):
    code, out, err = cli("export", run_a, "--format", "parquet")
    assert code == 2 and "-o" in err
    code, out, err = cli("export", run_a, "--format", "csv", "--what", "loads,nope", "-o",
                         tmp_path)
    assert code == 2 and "--what" in err and "nope" in err
    code, out, err = cli("export", run_a, "--format", "csv", "--what", "traces")
    assert code == 2 and "no traced steps" in err and "--trace-every" in err

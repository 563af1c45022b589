"""The token capacity (moe_rt --capacity-factor, /routing/dropped and /eval/dropped): the drop rate
of `summary`, `export`, `tensorboard` and `plot` against rates computed here in plain Python from
the counts the file holds; dropless files (without /routing/dropped, or with zeros and no
capacity) unchanged; rows not yet written (-1) or written by only some datasets not counted; a
resumed run whose older file has no drop counts; the capacity factor read from TOML."""
import os

import h5py
import numpy as np
import pytest

import moe_stats
import stats_fixture as sf

C = 1.0   # capacity 32 per expert and step: every load above the mean of 32 drops its excess


def capped_run(variant="B", evals=True, **kwargs):
    run = sf.with_capacity(sf.build_run(variant), C, **kwargs)
    return sf.with_eval(run, capacity_factor=C) if evals else run


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """Run B with a token capacity C = 1 and validation rows after every 5th step."""
    return sf.write_stats(str(tmp_path_factory.mktemp("drops") / "capped.h5"), capped_run())


@pytest.fixture(scope="module")
def dropless(tmp_path_factory):
    """Run A as a dropless run of a moe_rt that counts drops: /routing/dropped all zero, no
    capacity in the configuration."""
    run = sf.build_run("A")
    run = {**run, "datasets": {**run["datasets"], "routing/dropped": np.zeros_like(
        run["datasets"]["routing/expert_load"])}}
    return sf.write_stats(str(tmp_path_factory.mktemp("dropless") / "run_a.h5"), run)


def rates_from_counts(path, group="routing"):
    """(per_layer, per_step, total): the drop rate of each row and layer, of each row over all
    layers, and over every row and layer, summed in plain Python from /GROUP/dropped and
    /GROUP/expert_load of the rows whose /steps/step is written (of /eval: all rows)."""
    with h5py.File(path, "r") as f:
        dropped, load = f[f"{group}/dropped"][()], f[f"{group}/expert_load"][()]
        rows = (len(f["eval/step"]) if group == "eval"
                else sum(1 for s in f["steps/step"][()] if s >= 0))
        rows = min(rows, len(dropped), len(load))

    def rate(d, c):
        d, c = sum(int(x) for x in d), sum(int(x) for x in c)
        return d / c if c else 0.0

    per_layer = [[rate(dropped[n, l], load[n, l]) for l in range(load.shape[1])]
                 for n in range(rows)]
    per_step = [rate(dropped[n].reshape(-1), load[n].reshape(-1)) for n in range(rows)]
    total = rate(dropped[:rows].reshape(-1), load[:rows].reshape(-1))
    return per_layer, per_step, total


def layer_totals(path):
    """[L] the drop rate of each layer over every row."""
    with h5py.File(path, "r") as f:
        dropped, load = f["routing/dropped"][()], f["routing/expert_load"][()]
    return [int(dropped[:, l].sum()) / int(load[:, l].sum()) for l in range(load.shape[1])]


def pct(x):
    return f"{100 * x:.2f}%"


def summary_pairs(out):
    """{key: [value lines]} of the summary's header block (a line with an empty key continues the
    previous key's)."""
    pairs, key = {}, None
    for line in out.split("\n\n")[0].splitlines():
        if not line.startswith(" "):
            key = line.split("  ")[0]
        pairs.setdefault(key, []).append(line[len(key):].strip() if key else line.strip())
    return pairs


def test_the_fixture_drops_something_but_not_everywhere(capped):
    per_layer, per_step, total = rates_from_counts(capped)
    flat = [r for row in per_layer for r in row]
    assert 0 < total < 0.2 and min(flat) == 0.0 and max(flat) > 0.1
    # By hand: layer 0 at step 20 of run B has loads 40, 36, 28, 24 against a capacity of 32:
    # 8 + 4 = 12 of its 128 assignments dropped.
    assert per_layer[20][0] == 12 / 128


def test_library_rates_are_those_of_the_counts(capped, run_a):
    run = moe_stats.load_run(capped)
    per_layer, per_step, total = rates_from_counts(capped)
    assert moe_stats.layer_metrics(run)["drop_rate"] == pytest.approx(np.array(per_layer))
    assert moe_stats.step_drop_rate(run).tolist() == pytest.approx(per_step)
    assert moe_stats.METRICS["drop_rate"][0] == "1"
    assert moe_stats.capacity_on(run) and moe_stats.capacity_factor(run) == C
    assert run.eval["eval/dropped"].shape == run.eval["eval/expert_load"].shape
    # A file written before drops were counted: NaN, as z_loss; no capacity.
    old = moe_stats.load_run(run_a)
    assert np.isnan(moe_stats.layer_metrics(old)["drop_rate"]).all()
    assert moe_stats.step_drop_rate(old) is None and not moe_stats.capacity_on(old)


def test_capacity_factor_from_toml_and_old_text():
    def run_with(config):
        return moe_stats.Run(path="x.h5", attrs={"config": config}, routing=(), data={})

    toml = '[routing]\ntop-k = 2\ncapacity-factor = 1.25\ndrop-policy = "probs"\n'
    assert moe_stats.capacity_factor(run_with(toml)) == 1.25
    assert moe_stats.capacity_factor(run_with("[routing]\ncapacity-factor = 0.0\n")) == 0.0
    assert moe_stats.capacity_factor(run_with("capacity-factor = 2   # old format\n")) == 2.0
    assert moe_stats.capacity_factor(run_with("top-k = 2\n")) == 0.0       # before the option
    assert moe_stats.capacity_factor(run_with('capacity-factor = "x"\n')) is None
    assert not moe_stats.capacity_on(run_with("[routing]\ncapacity-factor = 0.0\n"))
    assert moe_stats.capacity_on(run_with(toml))


def test_summary_line(cli, capped):
    code, out, err = cli("summary", capped)
    assert code == 0, err
    per_layer, per_step, total = rates_from_counts(capped)
    pairs = summary_pairs(out)
    first, layers = pairs["dropped"]
    assert first == (f"{pct(total)} of the assignments over the run, {pct(per_step[-1])} at the "
                     f"last step (step 20); capacity-factor = 1, drop-policy = probs")
    assert layers == "per layer over the run: " + ", ".join(
        f"{l}: {pct(r)}" for l, r in enumerate(layer_totals(capped)))
    assert "0: 9.38%" in layers           # layer 0 drops 12 of 128 at every step
    # Validation: the last evaluation (after step 20) and all five.
    _, eval_steps, eval_total = rates_from_counts(capped, "eval")
    assert pairs["val dropped"] == [f"{pct(eval_steps[-1])} of the assignments on the validation "
                                    f"tokens after step 20, {pct(eval_total)} over the 5 "
                                    f"evaluations"]
    assert eval_total != total


def test_summary_of_dropless_files_is_unchanged(cli, run_a, dropless, tmp_path):
    code, plain, err = cli("summary", run_a)
    assert code == 0, err
    assert "dropped" not in plain
    code, out, err = cli("summary", dropless)
    assert code == 0, err
    assert out == plain.replace(run_a, dropless)
    # Validation rows with /eval/dropped but no capacity: no validation drop line either.
    quiet = sf.write_stats(str(tmp_path / "quiet.h5"), sf.with_eval(sf.build_run("A")))
    code, out, err = cli("summary", quiet)
    assert code == 0 and "val loss" in out and "dropped" not in out
    # A capacity that dropped nothing is still shown, at 0.
    zero = sf.with_capacity(sf.build_run("A"), 1.5)
    zero["datasets"]["routing/dropped"][:] = 0
    code, out, err = cli("summary", sf.write_stats(str(tmp_path / "zero.h5"), zero))
    assert code == 0, err
    assert summary_pairs(out)["dropped"][0].startswith(
        "0.00% of the assignments over the run, 0.00% at the last step (step 20); "
        "capacity-factor = 1.5")
    # Drops counted without the option in the text (a file of another writer): still shown.
    counted = capped_run(evals=False)
    counted["attrs"] = {**counted["attrs"], "config": sf.build_run("B")["attrs"]["config"]}
    code, out, err = cli("summary", sf.write_stats(str(tmp_path / "counted.h5"), counted))
    assert code == 0, err
    assert summary_pairs(out)["dropped"][0].endswith("at the last step (step 20)")


def test_unwritten_and_partial_rows_are_not_counted(cli, capped, tmp_path):
    # A last row whose /steps/step is still -1, every assignment of it dropped: not counted.
    run = capped_run(evals=False)
    extended = {}
    for name, data in run["datasets"].items():
        extra = data[-1:].copy()
        if name == "steps/step":
            extra[:] = -1
        elif name == "routing/dropped":
            extra[:] = run["datasets"]["routing/expert_load"][-1:]
        extended[name] = np.concatenate([data, extra])
    path = sf.write_stats(str(tmp_path / "unwritten.h5"), {**run, "datasets": extended})
    assert len(moe_stats.load_run(path).steps) == sf.NUM_STEPS
    code, out, err = cli("summary", path)
    assert code == 0, err
    assert summary_pairs(out)["dropped"] == summary_pairs(cli("summary", capped)[1])["dropped"]
    assert "100.00%" not in out
    # /routing/dropped a row short (a writer caught mid-step): the run ends a step earlier.
    short = sf.write_stats(str(tmp_path / "short.h5"), run,
                           lengths={"routing/dropped": sf.NUM_STEPS - 1})
    per_layer, per_step, total = rates_from_counts(short)
    assert len(per_step) == sf.NUM_STEPS - 1
    code, out, err = cli("summary", short)
    assert code == 0, err
    assert summary_pairs(out)["dropped"][0].startswith(
        f"{pct(total)} of the assignments over the run, {pct(per_step[-1])} at the last step "
        f"(step 19)")


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_columns(cli, capped, run_a, tmp_path, fmt):
    pd = pytest.importorskip("pandas")
    if fmt == "parquet":
        pytest.importorskip("pyarrow")

    def tables(path, folder):
        code, out, err = cli("export", path, "--format", fmt, "--what", "steps,layers,loads",
                             "-o", tmp_path / folder)
        assert code == 0, err
        read = pd.read_csv if fmt == "csv" else pd.read_parquet
        return {os.path.basename(p).split(".")[0]: read(p) for p in out.split()}

    got = tables(capped, "capped")
    per_layer, per_step, total = rates_from_counts(capped)
    assert got["steps"]["drop_rate"].tolist() == pytest.approx(per_step)
    layers = got["layers"].sort_values(["step", "layer"])
    assert layers["drop_rate"].to_numpy().reshape(sf.NUM_STEPS, sf.NUM_LAYERS) == \
        pytest.approx(np.array(per_layer))
    loads = got["loads"].sort_values(["step", "layer", "expert"])
    assert list(loads.columns) == ["step", "layer", "routing", "expert", "load", "load_ratio",
                                   "dropped"]
    with h5py.File(capped, "r") as f:
        assert loads["dropped"].tolist() == f["routing/dropped"][()].reshape(-1).tolist()
    assert (loads["dropped"] <= loads["load"]).all()
    # A file without /routing/dropped: no dropped or step drop_rate column, drop_rate NaN.
    old = tables(run_a, "old")
    assert "drop_rate" not in old["steps"].columns
    assert "dropped" not in old["loads"].columns
    assert old["layers"]["drop_rate"].isna().all()


def test_tensorboard_scalars(cli, capped, run_a, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator

    def scalars(path, label):
        code, out, err = cli("tensorboard", path, tmp_path, "--label", label)
        assert code == 0, err
        acc = event_accumulator.EventAccumulator(str(tmp_path / label),
                                                 size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        return acc

    acc = scalars(capped, "capped")
    per_layer, per_step, total = rates_from_counts(capped)
    events = acc.Scalars("drop_rate/all")
    assert [e.step for e in events] == list(range(sf.NUM_STEPS))
    assert [e.value for e in events] == pytest.approx(per_step, rel=1e-6)
    for layer in range(sf.NUM_LAYERS):
        events = acc.Scalars(f"drop_rate/layer{layer:02d}")
        assert [e.value for e in events] == pytest.approx([r[layer] for r in per_layer],
                                                          rel=1e-6, abs=1e-9)
    tags = set(scalars(run_a, "old").Tags()["scalars"])
    assert not [t for t in tags if "drop_rate" in t]


def test_plot_draws_the_drop_rate(cli, capped, run_a, dropless, tmp_path, monkeypatch):
    code, out, err = cli("plot", capped, "--out", tmp_path / "figs", "--format", "png,svg")
    assert code == 0, err
    names = {os.path.basename(p) for p in out.split()}
    assert {"drop_rate.png", "drop_rate.svg"} <= names and "drop_rate.pdf" not in names
    with open(tmp_path / "figs" / "drop_rate.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    for plain in (run_a, dropless):
        code, out, err = cli("plot", plain, "--out", tmp_path / "plain")
        assert code == 0, err
        assert "drop_rate.png" not in {os.path.basename(p) for p in out.split()}
    figures = {}
    monkeypatch.setattr(moe_stats, "save", lambda plt, fig, out_dir, name, dpi:
                        figures.setdefault(name, fig) and plt.close(fig) or name)
    moe_stats.write_plots([moe_stats.load_run(capped)], str(tmp_path))
    fig = figures["drop_rate.png"]
    ax = fig.axes[0]
    per_layer, per_step, total = rates_from_counts(capped)
    lines = ax.get_lines()
    assert [line.get_label() for line in lines[:sf.NUM_LAYERS]] == [
        f"layer {l}" for l in range(sf.NUM_LAYERS)]
    assert len(lines) == sf.NUM_LAYERS + 1                    # one per layer, then all layers
    for layer, line in enumerate(lines[:sf.NUM_LAYERS]):
        assert list(line.get_xdata()) == list(range(sf.NUM_STEPS))
        assert list(line.get_ydata()) == pytest.approx([r[layer] for r in per_layer])
    assert list(lines[-1].get_ydata()) == pytest.approx(per_step)
    assert ax.get_title() and ax.get_xlabel() == "step" and ax.get_ylabel()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [f"layer {l}" for l in range(sf.NUM_LAYERS)] + ["all layers"]
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)          # the legend right of the panel, never over the data
    assert fig.legends[0].get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def test_plot_of_two_runs_and_selected_layers(capped, run_a, tmp_path, monkeypatch):
    figures = {}
    monkeypatch.setattr(moe_stats, "save", lambda plt, fig, out_dir, name, dpi:
                        figures.setdefault(name, fig) and plt.close(fig) or name)
    options = moe_stats.PlotOptions(layers=(0, 2), steps=(5, 15))
    # Run B without a capacity: only run A's lines, still drawn.
    moe_stats.write_plots([moe_stats.load_run(capped), moe_stats.load_run(run_a)],
                          str(tmp_path), options=options)
    lines = figures["drop_rate.png"].axes[0].get_lines()
    per_layer, per_step, total = rates_from_counts(capped)
    assert len(lines) == 3
    assert list(lines[0].get_xdata()) == list(range(5, 16))
    assert list(lines[1].get_ydata()) == pytest.approx([r[2] for r in per_layer[5:16]])
    assert list(lines[2].get_ydata()) == pytest.approx(per_step[5:16])


def test_a_resumed_run_with_and_without_drop_counts(cli, capped, tmp_path):
    run = capped_run()
    first = sf.write_segment(str(tmp_path / "a.h5"), run, 0, 12)
    last = sf.write_segment(str(tmp_path / "b.h5"), run, 10, 21, predecessor=first, step=9)
    joined, whole = moe_stats.load_run(last), moe_stats.load_run(capped)
    assert np.array_equal(joined.data["routing/dropped"], whole.data["routing/dropped"])
    assert np.array_equal(joined.eval["eval/dropped"], whole.eval["eval/dropped"])
    assert summary_pairs(cli("summary", last)[1])["dropped"] == \
        summary_pairs(cli("summary", capped)[1])["dropped"]
    # The older file written before drops were counted (no /routing/dropped, no /eval/dropped):
    # the joined run has no drop counts, as for z_loss; the capacity is still said.
    old = sf.write_segment(str(tmp_path / "c.h5"), run, 0, 12,
                           drop=("routing/dropped", "eval/dropped"))
    newer = sf.write_segment(str(tmp_path / "d.h5"), run, 10, 21, predecessor=old, step=9)
    joined = moe_stats.load_run(newer)
    assert "routing/dropped" not in joined.data and "eval/dropped" not in joined.eval
    assert len(joined.eval["eval/step"]) > 0
    assert np.isnan(moe_stats.layer_metrics(joined)["drop_rate"]).all()
    code, out, err = cli("summary", newer)
    assert code == 0, err
    pairs = summary_pairs(out)
    assert pairs["dropped"][0].startswith("unknown: a file of the run has no /routing/dropped")
    assert "val dropped" not in pairs
    code, out, err = cli("plot", newer, "--out", tmp_path / "figs")
    assert code == 0 and "drop_rate.png" not in {os.path.basename(p) for p in out.split()}
    # The other way round (a newer writer without /eval/dropped): the same rule, no error.
    recent = sf.write_segment(str(tmp_path / "e.h5"), run, 10, 21, predecessor=first, step=9,
                              drop=("eval/dropped",))
    joined = moe_stats.load_run(recent)
    assert "eval/dropped" not in joined.eval and "routing/dropped" in joined.data
    assert joined.eval["eval/step"].tolist() == [0, 5, 10, 15, 20]
    assert "val dropped" not in summary_pairs(cli("summary", recent)[1])
    # Read alone, the newer file has its counts.
    code, out, err = cli("summary", newer, "--no-chain")
    assert code == 0, err
    assert summary_pairs(out)["dropped"][0].endswith(
        "(step 20); capacity-factor = 1, drop-policy = probs")


def test_malformed_drop_counts_are_one_line(cli, tmp_path):
    run = capped_run()
    path = sf.write_stats(str(tmp_path / "narrow.h5"), run)
    with h5py.File(path, "a") as f:
        del f["routing/dropped"]
        f["routing/dropped"] = np.zeros((sf.NUM_STEPS, sf.NUM_LAYERS, 3), dtype=np.int64)
    code, out, err = cli("summary", path)
    assert code == 2 and len(err.splitlines()) == 1
    assert "/routing/dropped has row shape (6, 3)" in err
    with h5py.File(path, "a") as f:
        del f["routing/dropped"]
        f["routing/dropped"] = np.zeros((sf.NUM_STEPS, sf.NUM_LAYERS * sf.NUM_EXPERTS))
        del f["eval/dropped"]
        f["eval/dropped"] = np.zeros((5, sf.NUM_LAYERS, 3), dtype=np.int64)
    code, out, err = cli("summary", path)
    assert code == 2 and "/routing/dropped has 2 dimensions, expected 3" in err
    with h5py.File(path, "a") as f:
        del f["routing/dropped"]
    code, out, err = cli("summary", path)
    assert code == 2 and "/eval/dropped has row shape (6, 3)" in err

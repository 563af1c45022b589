"""Shadow balancers (moe_rt --shadow, the /shadow group): the `shadows` table against numbers
computed here from the written loads, hand-checked values, rows not yet written (-1) and rows
missing from one shadow dataset, a resumed run, the absent-/shadow error, the `summary` line, the
`shadows` figure, the `shadow_violation` export table and the TensorBoard scalars."""
import math
import os

import h5py
import numpy as np
import pytest

import moe_stats
import stats_fixture as sf

TOPK_LAYERS = list(range(sf.NUM_HASH, sf.NUM_LAYERS))
REAL = "real (the run's own)"


@pytest.fixture(scope="module")
def shadowed(tmp_path_factory):
    """Run B with the three shadow balancers of the fixture."""
    path = str(tmp_path_factory.mktemp("shadows") / "shadowed.h5")
    return sf.write_stats(path, sf.build_run("B", shadows=sf.SHADOW_RULES))


def violations_from_loads(path):
    """{policy label: [[max violation of layer l at row n for l in top-k layers] for n]} computed
    in plain Python from the expert loads the file holds (not from its max_violation datasets)."""
    with h5py.File(path, "r") as f:
        loads = {REAL: f["routing/expert_load"][()]}
        loads.update({rule: f[f"shadow/{rule}/expert_load"][()] for rule in sf.SHADOW_RULES})
    out = {}
    for label, load in loads.items():
        rows = []
        for n in range(load.shape[0]):
            row = []
            for layer in TOPK_LAYERS:
                counts = [int(c) for c in load[n, layer]]
                mean = sum(counts) / len(counts)
                row.append((max(counts) - mean) / mean)
            rows.append(row)
        out[label] = rows
    return out


def expected_row(series, steps):
    """(worst, step of the first worst, mean of the last quarter, final) of a list of values."""
    worst = max(series)
    late = math.ceil(len(series) / 4)
    return worst, steps[series.index(worst)], sum(series[-late:]) / late, series[-1]


def table_rows(out):
    """{(layer, policy): (worst, at step, late mean, final)} parsed from the `shadows` table."""
    rows = {}
    body = out.split("\nlayer  policy")[1].splitlines()[1:]
    for line in body:
        if not line.strip():
            continue
        layer, rest = line.split(None, 1)
        policy, worst, step, late, final = rest.rsplit(None, 4)
        rows[(layer, policy.strip())] = (worst, step, late, final)
    return rows


def test_table_numbers_are_those_of_the_loads(cli, shadowed):
    code, out, err = cli("shadows", shadowed)
    assert code == 0, err
    assert err == ""
    assert "last 6 steps (15 .. 20, the last quarter)" in out
    rows = table_rows(out)
    computed = violations_from_loads(shadowed)
    steps = list(range(sf.NUM_STEPS))
    labels = [REAL] + list(sf.SHADOW_RULES)
    expected_keys = [(str(l), p) for l in TOPK_LAYERS for p in labels] + [("all", p)
                                                                         for p in labels]
    assert list(rows) == expected_keys           # hash layers 0, 1 left out; real first
    for label in labels:
        for i, layer in enumerate(TOPK_LAYERS):
            series = [r[i] for r in computed[label]]
            worst, step, late, final = expected_row(series, steps)
            assert rows[(str(layer), label)] == (f"{worst:.3f}", str(step), f"{late:.3f}",
                                                 f"{final:.3f}"), (layer, label)
        worst, step, late, final = expected_row([max(r) for r in computed[label]], steps)
        assert rows[("all", label)] == (f"{worst:.3f}", str(step), f"{late:.3f}",
                                        f"{final:.3f}"), label
    # By hand: layer 2 of "none" ends at loads 62, 42, 22, 2 (mean 32): (62 - 32)/32 = 0.9375;
    # "sign:0.001" peaks at step 6 with 50, 38, 26, 14: 18/32 = 0.5625; every policy starts at
    # step 0 with 44, 36, 28, 20: 12/32 = 0.375.
    assert rows[("2", "none")][3] == "0.938"
    assert rows[("2", "sign:0.001")][:2] == ("0.562", "6")
    assert rows[("all", "proportional:0.01")][:2] == ("0.375", "0")


def test_unwritten_rows_are_not_counted(cli, tmp_path):
    # A last row whose /steps/step is still the fill value -1, its shadow rows far out of balance:
    # it must not count (nor must a row only some shadow datasets have).
    run = sf.build_run("B", shadows=sf.SHADOW_RULES)
    extended = {}
    for name, data in run["datasets"].items():
        extra = data[-1:].copy()
        if name == "steps/step":
            extra[:] = -1
        elif name.endswith("max_violation"):
            extra[:] = 9.0
        extended[name] = np.concatenate([data, extra])
    path = sf.write_stats(str(tmp_path / "unwritten.h5"), {**run, "datasets": extended})
    code, out, err = cli("shadows", path)
    assert code == 0, err
    assert "steps 0 .. 20 (21 steps)" in out and "9.000" not in out
    assert table_rows(out) == table_rows(cli("shadows", sf.write_stats(
        str(tmp_path / "whole.h5"), run))[1])
    # One shadow dataset a row short (a writer caught mid-step): the run ends a step earlier.
    short = sf.write_stats(str(tmp_path / "short.h5"), run,
                           lengths={"shadow/none/bias": sf.NUM_STEPS - 1})
    code, out, err = cli("shadows", short)
    assert code == 0, err
    assert "steps 0 .. 19 (20 steps)" in out
    computed = violations_from_loads(short)
    final = computed["none"][sf.NUM_STEPS - 2][0]             # layer 2 at step 19
    assert table_rows(out)[("2", "none")][3] == f"{final:.3f}"
    assert moe_stats.load_run(short).data["routing/expert_load"].shape[0] == sf.NUM_STEPS - 1


def test_a_resumed_run_with_shadows_reads_like_the_whole_run(cli, tmp_path, shadowed):
    run = sf.build_run("B", shadows=sf.SHADOW_RULES)
    first = sf.write_segment(str(tmp_path / "a.h5"), run, 0, 12)
    last = sf.write_segment(str(tmp_path / "b.h5"), run, 10, 21, predecessor=first, step=9)
    code, out, err = cli("shadows", last)
    assert code == 0, err
    assert table_rows(out) == table_rows(cli("shadows", shadowed)[1])
    # A predecessor without /shadow: the chain has no shadows in every file.
    plain = sf.write_segment(str(tmp_path / "c.h5"), sf.build_run("B"), 0, 12)
    newer = sf.write_segment(str(tmp_path / "d.h5"), run, 10, 21, predecessor=plain, step=9)
    code, out, err = cli("shadows", newer)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "resumed run" in err and "--no-chain" in err
    code, out, err = cli("shadows", newer, "--no-chain")
    assert code == 0, err
    assert "steps 10 .. 20 (11 steps)" in out


def test_a_file_without_shadows_is_one_line_and_exit_2(cli, run_a):
    code, out, err = cli("shadows", run_a)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("moe_stats.py: error: ") and run_a in lines[0]
    assert "no shadow balancers" in lines[0] and "--shadow" in lines[0]


def test_a_malformed_shadow_group_is_one_line(cli, tmp_path):
    path = sf.write_stats(str(tmp_path / "nobias.h5"), sf.build_run("A", shadows=("none",)),
                          drop=("shadow/none/bias",))
    code, out, err = cli("summary", path)
    assert code == 2 and len(err.splitlines()) == 1
    assert "/shadow/none lacks the dataset /shadow/none/bias" in err
    path = sf.write_stats(str(tmp_path / "narrow.h5"), sf.build_run("A", shadows=("none",)))
    with h5py.File(path, "a") as f:
        del f["shadow/none/max_violation"]
        f["shadow/none/max_violation"] = np.zeros((sf.NUM_STEPS, 3))
    code, out, err = cli("shadows", path)
    assert code == 2 and "/shadow/none/max_violation has row shape (3,)" in err


def test_summary_names_the_shadows(cli, shadowed, run_a):
    code, out, err = cli("summary", shadowed)
    assert code == 0, err
    computed = violations_from_loads(shadowed)
    line = next(l for l in out.splitlines() if l.startswith("shadows"))
    expected = ", ".join(f"{label} {max(computed[label][-1]):.3f}"
                         for label in [REAL] + list(sf.SHADOW_RULES))
    assert f"at step 20: {expected}" in line
    assert "none 0.938" in line
    code, out, err = cli("summary", run_a)
    assert code == 0 and not any(l.startswith("shadows") for l in out.splitlines())


def test_plot_draws_the_shadows_figure(cli, shadowed, run_a, tmp_path, monkeypatch):
    code, out, err = cli("plot", shadowed, "--out", tmp_path / "figs", "--format", "png,svg")
    assert code == 0, err
    names = {os.path.basename(p) for p in out.split()}
    assert {"shadows.png", "shadows.svg"} <= names
    with open(tmp_path / "figs" / "shadows.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(tmp_path / "figs" / "shadows.png") > 1024
    code, out, err = cli("plot", run_a, "--out", tmp_path / "plain")
    assert code == 0 and "shadows.png" not in {os.path.basename(p) for p in out.split()}
    # The lines are the worst top-k layer at each step, one per policy, the real one first.
    figures = {}
    monkeypatch.setattr(moe_stats, "save", lambda plt, fig, out_dir, name, dpi:
                        figures.setdefault(name, fig) and plt.close(fig) or name)
    moe_stats.write_plots([moe_stats.load_run(shadowed)], str(tmp_path))
    ax = figures["shadows.png"].axes[0]
    computed = violations_from_loads(shadowed)
    lines = ax.get_lines()
    assert len(lines) == 1 + len(sf.SHADOW_RULES)
    for line, label in zip(lines, [REAL] + list(sf.SHADOW_RULES)):
        assert list(line.get_xdata()) == list(range(sf.NUM_STEPS))
        assert list(line.get_ydata()) == pytest.approx([max(r) for r in computed[label]])
    fig = figures["shadows.png"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [REAL] + [f"shadow {rule}" for rule in sf.SHADOW_RULES]
    assert ax.get_title() and ax.get_xlabel() == "step" and ax.get_ylabel()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)          # the legend right of the panel, never over the data
    assert fig.legends[0].get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_shadow_violation(cli, shadowed, run_a, tmp_path, fmt):
    pd = pytest.importorskip("pandas")
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    target = tmp_path / f"shadow_violation.{fmt}"
    code, out, err = cli("export", shadowed, "--format", fmt, "--what", "shadow_violation",
                         "-o", target)
    assert code == 0, err
    frame = pd.read_csv(target) if fmt == "csv" else pd.read_parquet(target)
    assert list(frame.columns) == ["step", "policy", "layer", "max_violation"]
    policies = ["real"] + list(sf.SHADOW_RULES)
    assert len(frame) == sf.NUM_STEPS * len(policies) * len(TOPK_LAYERS)
    assert sorted(frame["layer"].unique()) == TOPK_LAYERS
    computed = violations_from_loads(shadowed)
    for policy in policies:
        part = frame[frame["policy"].astype(str) == policy].sort_values(["step", "layer"])
        values = part["max_violation"].to_numpy().reshape(sf.NUM_STEPS, len(TOPK_LAYERS))
        assert values == pytest.approx(np.array(computed[REAL if policy == "real" else policy]))
    # "all" holds the table only where the file has shadows; asked for, it is an error without.
    code, out, err = cli("export", run_a, "--format", "csv", "-o", tmp_path / "all")
    assert code == 0 and "shadow_violation.csv" not in {os.path.basename(p) for p in out.split()}
    code, out, err = cli("export", run_a, "--format", "csv", "--what", "shadow_violation")
    assert code == 2 and "no shadow balancers" in err


def test_tensorboard_shadow_scalars(cli, shadowed, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator
    code, out, err = cli("tensorboard", shadowed, tmp_path, "--label", "s")
    assert code == 0, err
    acc = event_accumulator.EventAccumulator(str(tmp_path / "s"),
                                             size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    computed = violations_from_loads(shadowed)
    tags = {t for t in acc.Tags()["scalars"] if t.startswith("worst_violation/")}
    assert tags == {f"worst_violation/{p}" for p in ["real"] + list(sf.SHADOW_RULES)}
    for policy in ["real"] + list(sf.SHADOW_RULES):
        events = acc.Scalars(f"worst_violation/{policy}")
        assert [e.step for e in events] == list(range(sf.NUM_STEPS))
        assert [e.value for e in events] == pytest.approx(
            [max(r) for r in computed[REAL if policy == "real" else policy]], rel=1e-6)

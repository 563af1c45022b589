"""`moe_stats.py compare`: the table's values against values computed here with numpy straight
from the HDF5 datasets (last step and --window), in text, markdown and CSV; the labels (short
file names made unique, --label, bad counts); three runs, one with a token capacity and
validation rows; a resumed run; runs of another shape; the figures: the files, the shared step
axis, the legend of labels, the difference heatmaps' values and their map centred at 0."""
import csv
import io
import os
import re
import shutil

import h5py
import numpy as np
import pytest

import moe_stats
import stats_fixture as sf

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TOPK_LAYERS = list(range(sf.NUM_HASH, sf.NUM_LAYERS))


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """Run B with a token capacity C = 1 and validation rows after every 5th step."""
    run = sf.with_eval(sf.with_capacity(sf.build_run("B"), 1.0))
    return sf.write_stats(str(tmp_path_factory.mktemp("compare") / "capped.h5"), run)


@pytest.fixture
def no_figures(monkeypatch):
    """The figures drawn but not written (the table tests); {file name: figure}."""
    figures = {}

    def keep(plt, fig, out_dir, filename, dpi, formats=("png",)):
        figures[filename] = fig
        plt.close(fig)
        return os.path.join(out_dir, filename)

    monkeypatch.setattr(moe_stats, "save", keep)
    return figures


def from_file(path, window=1):
    """Independent computation: (loss, validation loss or None, {layer: max violation},
    drop rate or None) of the file's last `window` rows."""
    with h5py.File(path, "r") as f:
        loss = f["steps/loss"][-window:].mean()
        load = f["routing/expert_load"][-window:].astype(np.float64)           # [w, L, E]
        dropped = f["routing/dropped"][-window:] if "routing/dropped" in f else None
        val = float(f["eval/loss"][-1]) if "eval" in f else None
    mean = load.mean(axis=2)
    violation = ((load.max(axis=2) - mean) / mean).mean(axis=0)
    rate = None if dropped is None else float(dropped.sum()) / float(load.sum())
    return float(loss), val, {l: float(violation[l]) for l in TOPK_LAYERS}, rate


def csv_table(out):
    rows = list(csv.reader(io.StringIO(out)))
    return rows[0], {row[0]: row[1:] for row in rows[1:]}


def text_table(out):
    """{row name: cells} of the text table, split on 2+ spaces."""
    lines = out.split("\n\n")[1].splitlines()
    header = re.split(r"\s{2,}", lines[0].strip())
    return header, {cells[0]: cells[1:] for cells in
                    (re.split(r"\s{2,}", line.strip()) for line in lines[2:])}


@pytest.mark.parametrize("window", [1, 5])
def test_table_values_equal_the_files(cli, run_a, run_b, capped, window):
    paths = [run_a, run_b, capped]
    code, out, err = cli("compare", *paths, "--csv", "--window", window, "--no-figures")
    assert code == 0, err
    header, rows = csv_table(out)
    assert header == ["quantity", "run_a", "run_b", "capped"]
    for i, path in enumerate(paths):
        loss, val, violation, rate = from_file(path, window)
        assert float(rows["loss"][i]) == pytest.approx(loss, rel=1e-12)
        assert rows["last step"][i] == "20"
        for layer in TOPK_LAYERS:
            assert float(rows[f"max violation, layer {layer}"][i]) == pytest.approx(
                violation[layer], rel=1e-12, abs=1e-15)
        assert float(rows["worst max violation (top-k layers)"][i]) == pytest.approx(
            max(violation.values()), rel=1e-12)
        assert rows["validation loss"][i] == ("" if val is None else repr(val))
        if rate is None:
            assert rows["drop rate"][i] == ""
        else:
            assert float(rows["drop rate"][i]) == pytest.approx(100 * rate, rel=1e-12)
    assert rows["validation after step"] == ["", "", "20"]
    assert not any(name.startswith("max violation, layer 0") for name in rows)   # hash layers


def test_text_and_markdown_agree_with_csv(cli, run_a, run_b, capped, tmp_path, no_figures):
    args = ("compare", run_a, run_b, capped)
    _, text_out, _ = cli(*args, "--no-figures")
    _, md_out, _ = cli(*args, "--markdown", "--layers", "2", "--out", tmp_path)
    _, csv_out, _ = cli(*args, "--csv", "--no-figures")
    assert text_out.startswith("=== 3 runs compared (last step of each run) ===")
    header, text = text_table(text_out)
    _, rows = csv_table(csv_out)
    assert header == ["run_a", "run_b", "capped"]
    assert list(text) == list(rows)
    assert text["drop rate"][:2] == ["-", "-"] and text["validation loss"][:2] == ["-", "-"]
    assert text["drop rate"][2] == f"{float(rows['drop rate'][2]):.2f}%"
    assert text["loss"] == [f"{float(v):.4f}" for v in rows["loss"]]
    md = [[c.strip() for c in line.strip("|").split("|")] for line in md_out.splitlines()
          if line.startswith("| ")]
    assert md[0] == ["", "run_a", "run_b", "capped"]
    md = {cells[0]: cells[1:] for cells in md[1:]}
    assert md == {name: cells for name, cells in text.items()       # --layers 2: its row only
                  if not re.match(r"max violation, layer [345]|worst", name)}
    for out in (text_out, md_out):        # which file each label is
        assert f"run_a: {run_a} (steps 0..20)" in out
    assert md_out.endswith("figures:\n" + "".join(
        f"{os.path.join(str(tmp_path), name)}\n" for name in sorted(no_figures)))
    assert "figures" not in text_out and "%" not in csv_out
    assert not [cell for cells in rows.values() for cell in cells if cell in ("-", "n/a")]


def test_labels_default_to_short_unique_file_names(cli, run_a, tmp_path, no_figures):
    for folder in ("x", "y"):
        os.makedirs(tmp_path / folder)
        shutil.copy(run_a, tmp_path / folder / "run.h5")
    code, out, err = cli("compare", tmp_path / "x" / "run.h5", tmp_path / "y" / "run.h5",
                         run_a, "--csv", "--no-figures")
    assert code == 0, err
    assert csv_table(out)[0] == ["quantity", "x/run", "y/run", "run_a"]
    assert moe_stats.short_labels(["a/x/A.h5", "b/x/A.h5", "c/B.h5", "c/B.h5"]) == [
        "a/x/A", "b/x/A", "B", "B (2)"]
    code, out, err = cli("compare", run_a, run_a, "--label", "first", "--label", "second",
                         "--csv", "--layers", "2", "--out", tmp_path / "figs")
    assert code == 0, err
    assert csv_table(out)[0] == ["quantity", "first", "second"]
    legend = no_figures["compare.png"].legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["first", "second"]


@pytest.mark.parametrize("labels,words", [
    (["one"], "--label given 1 times for 2 runs"),
    (["same", "same"], "--label 'same' names two runs"),
])
def test_bad_labels(cli, run_a, run_b, tmp_path, labels, words):
    args = [arg for label in labels for arg in ("--label", label)]
    code, out, err = cli("compare", run_a, run_b, *args, "--out", tmp_path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert words in err


def narrow_run(experts):
    load = np.full((sf.NUM_STEPS, sf.NUM_LAYERS, experts), sf.MEAN_LOAD, dtype=np.int64)
    return sf.build_loads_run(load, sf.WORLD, hash_layers=sf.NUM_HASH)


def test_runs_of_another_shape_are_an_error(cli, run_a, run_b, tmp_path):
    other = sf.write_stats(str(tmp_path / "eight.h5"), narrow_run(8))
    code, out, err = cli("compare", run_a, run_b, other, "--out", tmp_path / "figs")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "eight.h5: 6 layers x 8 experts" in err and "same shape" in err
    assert not (tmp_path / "figs").exists()
    code, out, err = cli("compare", run_a, "--out", tmp_path / "figs")
    assert code == 2 and err.strip().endswith("compare needs 2 or more runs, got 1")


def test_a_resumed_run_is_read_whole(cli, run_a, tmp_path):
    whole = sf.build_run("B")
    first = sf.write_segment(str(tmp_path / "first.h5"), whole, 0, 12)
    second = sf.write_segment(str(tmp_path / "second.h5"), whole, 12, sf.NUM_STEPS,
                              predecessor=first)
    reference = sf.write_stats(str(tmp_path / "whole.h5"), whole)
    _, out, _ = cli("compare", run_a, second, reference, "--csv", "--window", 15,
                    "--no-figures")
    _, rows = csv_table(out)
    assert all(values[1] == values[2] for values in rows.values())
    _, out, _ = cli("compare", run_a, second, "--window", 15, "--no-figures")
    assert f"second: {second} (steps 0..20, 2 files)" in out
    _, out, _ = cli("compare", run_a, second, "--csv", "--window", 15, "--no-chain",
                    "--no-figures")
    # The newest file alone: 9 rows, fewer than the window, all of them averaged.
    with h5py.File(second, "r") as f:
        assert float(csv_table(out)[1]["loss"][1]) == pytest.approx(f["steps/loss"][:].mean())


def test_routing_mismatch_is_a_warning(cli, run_a, tmp_path):
    run = sf.build_run("B")
    run["strings"]["layers/routing"] = ["hash"] * 3 + ["topk"] * 3
    rerouted = sf.write_stats(str(tmp_path / "rerouted.h5"), run)
    code, out, err = cli("compare", run_a, rerouted, "--csv", "--no-figures")
    assert code == 0
    assert "rerouted.h5: layer routing" in err and "warning" in err
    assert "max violation, layer 2" in out           # top-k in run_a


def test_drop_rate_of_a_capacity_without_counts(cli, run_a, tmp_path):
    # A capacity in the configuration, but a file written before drops were counted: n/a.
    run = sf.with_capacity(sf.build_run("B"), 1.0)
    uncounted = sf.write_stats(str(tmp_path / "uncounted.h5"), run, drop=("routing/dropped",))
    code, out, err = cli("compare", run_a, uncounted, "--no-figures")
    assert code == 0, err
    assert text_table(out)[1]["drop rate"] == ["-", "n/a"]


def test_figures_are_written_beside_the_first_file(cli, run_a, run_b, capped, tmp_path):
    local = tmp_path / "a.h5"
    shutil.copy(run_a, local)
    code, out, err = cli("compare", local, run_b, capped, "--layers", "2")
    assert code == 0, err
    paths = out.split("figures:\n")[1].split()
    assert [os.path.basename(p) for p in paths] == [
        "compare.png", "expert_load_diff_2.png", "expert_load_diff_3.png"]
    for path in paths:
        assert os.path.dirname(path) == str(tmp_path / "a-compare")
        with open(path, "rb") as f:
            assert f.read(8) == PNG_SIGNATURE
        assert os.path.getsize(path) > 1024


def test_figure_contents(cli, run_a, run_b, capped, tmp_path, no_figures):
    code, out, err = cli("compare", run_a, run_b, capped, "--paper", "--out", tmp_path)
    assert code == 0, err
    assert set(no_figures) == {"compare.pdf", "expert_load_diff_2.pdf",
                               "expert_load_diff_3.pdf"}
    lines = no_figures["compare.pdf"]
    assert lines.get_size_inches()[0] == pytest.approx(3.5)
    titles = [ax.get_title() for ax in lines.axes]
    assert titles[0].startswith("Training loss") and titles[1] == "Validation loss"
    assert "violation" in titles[2] and "token capacity" in titles[3]
    assert all(lines.axes[0].get_shared_x_axes().joined(lines.axes[0], ax)
               for ax in lines.axes[1:])
    assert [t.get_text() for t in lines.legends[0].get_texts()] == ["run_a", "run_b", "capped"]
    colours = [line.get_color() for line in lines.axes[0].get_lines()]
    assert len(set(map(str, colours))) == 3
    # Run 3 against run 1, top-k layers in rows: run 1's load / mean load, run 3's, their
    # difference, on a diverging map whose limits are symmetric about 0.
    diff = no_figures["expert_load_diff_3.pdf"]
    panels = [ax for ax in diff.axes if ax.images]
    assert len(panels) == 3 * len(TOPK_LAYERS)
    with h5py.File(run_a, "r") as f:
        first = f["routing/expert_load"][()].astype(np.float64)
    with h5py.File(capped, "r") as f:
        third = f["routing/expert_load"][()].astype(np.float64)
    ratio = lambda load: load / load.mean(axis=2, keepdims=True)          # noqa: E731
    for row, layer in enumerate(TOPK_LAYERS):
        ref, other, delta = (panels[3 * row + i].images[0] for i in range(3))
        assert np.allclose(ref.get_array(), ratio(first)[:, layer, :].T)
        assert np.allclose(other.get_array(), ratio(third)[:, layer, :].T)
        assert np.allclose(delta.get_array(), (ratio(third) - ratio(first))[:, layer, :].T)
        assert delta.get_cmap().name == "PuOr_r"
        assert delta.norm.vmin == -delta.norm.vmax > -np.inf
        assert ref.norm.vmax == 2.0 and ref.norm(1.0) == 0.5        # E/K, white at 1
    assert panels[0].get_title() == "run_a" and panels[2].get_title() == "capped − run_a"


def test_runs_without_common_steps_get_no_difference_figure(cli, run_a, tmp_path, no_figures):
    later = sf.rows_of(sf.build_run("B"), 10, sf.NUM_STEPS)
    early = sf.write_stats(str(tmp_path / "early.h5"), sf.rows_of(sf.build_run("A"), 0, 10))
    later = sf.write_stats(str(tmp_path / "later.h5"), later)
    code, out, err = cli("compare", early, later, "--layers", "2", "--out", tmp_path / "figs")
    assert code == 0, err
    assert "no step in common" in err and "expert_load_diff_2" in err
    assert set(no_figures) == {"compare.png"}


def test_a_link_is_named_after_its_file(cli, run_a, run_b, tmp_path):
    # runs/latest.h5 is a link: tables, legends, TensorBoard and MLflow name the run it points to,
    # so that two runs read through the link do not share a name.
    shutil.copy(run_a, tmp_path / "run_a.h5")
    os.symlink("run_a.h5", tmp_path / "latest.h5")
    assert moe_stats.load_run(str(tmp_path / "latest.h5")).name == "run_a.h5"
    code, out, err = cli("compare", tmp_path / "latest.h5", run_b, "--no-figures", "--csv")
    assert code == 0, err
    assert next(csv.reader(io.StringIO(out)))[1:] == ["run_a", "run_b"]

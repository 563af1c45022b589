"""`moe_stats.py plot`: non-empty PNG, PDF and SVG files, listed on stdout, and every figure
titled, with axis labels (no "(1)" unit on ratios) and a legend outside the panels (a colour bar
for the heatmaps, up to the collapse ceiling E/K, its labels clear of one another at 150 dpi);
runs named by short labels; no two series of an axes alike, also past the colour cycles; the
ranks' and the layers' legends apart; --label, --layers, --steps and --paper (PDF one column
wide, serif, without touching matplotlib's global settings)."""
import os
import shutil
import re

import numpy as np
import pytest

import moe_stats
import stats_fixture as sf

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TWO_RUN_FILES = {"expert_load_A.png", "expert_load_B.png", "balance.png", "metrics.png",
                 "bias.png", "ranks.png", "loss.png", "phases.png"}


def assert_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE, path
    assert os.path.getsize(path) > 1024, path


def test_plot_two_runs(cli, run_a, run_b, tmp_path):
    out_dir = tmp_path / "figures"          # created by the command
    code, out, err = cli("plot", run_a, run_b, "--out", out_dir)
    assert code == 0, err
    written = out.split()
    assert {os.path.basename(p) for p in written} == TWO_RUN_FILES
    for path in written:
        assert os.path.dirname(path) == str(out_dir)
        assert_png(path)


def test_plot_one_run(cli, run_a, tmp_path):
    code, out, err = cli("plot", run_a, "--out", tmp_path)
    assert code == 0, err
    assert {os.path.basename(p) for p in out.split()} == TWO_RUN_FILES - {"expert_load_B.png"}
    for path in out.split():
        assert_png(path)


def test_plot_without_out_writes_beside_the_file(cli, run_a, tmp_path):
    # moe_rt's summary suggests `plot RUN.h5 --out RUN-plots`; without --out, the same folder.
    local = tmp_path / "run.h5"
    shutil.copy(run_a, local)
    code, out, err = cli("plot", local)
    assert code == 0, err
    assert {os.path.dirname(p) for p in out.split()} == {str(tmp_path / "run-plots")}
    assert_png(out.split()[0])
    # Through a link such as runs/latest.h5: the folder is named after the file linked to.
    os.symlink("run.h5", tmp_path / "latest.h5")
    code, out, err = cli("plot", tmp_path / "latest.h5")
    assert code == 0, err
    assert {os.path.dirname(p) for p in out.split()} == {str(tmp_path / "run-plots")}


def test_every_figure_has_title_labels_and_legend(run_a, run_b, tmp_path, monkeypatch):
    figures = []
    real_save = moe_stats.save

    def keep(plt, fig, out_dir, filename, dpi):
        figures.append((filename, fig))
        fig.canvas.draw()  # before close: the checks below read the artists
        return real_save(plt, fig, out_dir, filename, dpi)

    monkeypatch.setattr(moe_stats, "save", keep)
    runs = [moe_stats.load_run(run_a), moe_stats.load_run(run_b)]
    moe_stats.write_plots(runs, str(tmp_path))
    assert {name for name, _ in figures} == TWO_RUN_FILES
    for name, fig in figures:
        plots = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
        assert plots, name
        has_suptitle = fig._suptitle is not None and fig._suptitle.get_text()
        for ax in plots:
            assert ax.get_title() or has_suptitle, name
            assert ax.get_xlabel() and ax.get_ylabel(), (name, ax.get_title())
        colorbars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
        assert not [ax for ax in plots if ax.get_legend() is not None], name   # outside only
        assert fig.legends or colorbars, name
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
        for legend in fig.legends:    # right of every panel: never over the data
            box = legend.get_window_extent(renderer)
            assert all(box.x0 >= ax.get_window_extent(renderer).x1 for ax in plots), name
        for ax in plots:              # ratios are dimensionless: no "(1)" as their unit
            assert "(1)" not in ax.get_ylabel() + ax.get_xlabel(), (name, ax.get_ylabel())
        texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
        texts += [ax.get_title() for ax in plots] + [has_suptitle or ""]
        folder = os.path.basename(os.path.dirname(run_a))
        assert not [t for t in texts if ".h5" in t or folder in t], (name, texts)  # short labels
        assert_distinct_series(fig, name)
        if colorbars:
            assert colorbars[0].get_ylabel(), name
            # The colour scale runs from 0 to the collapse ceiling E/K = 4/2, marked.
            assert colorbars[0].get_ylim() == (0.0, 2.0), name
            labels = [t.get_text() for t in colorbars[0].get_yticklabels()]
            assert any("E/K" in t and "collapse" in t for t in labels), labels


def test_layer_colours_agree_across_figures(run_a, run_b, tmp_path, monkeypatch):
    colours = {}
    real_save = moe_stats.save

    def keep(plt, fig, out_dir, filename, dpi):
        for ax in fig.axes:
            for line in ax.get_lines():
                match = re.fullmatch(r"layer (\d+)", line.get_label())
                if match:
                    colours.setdefault(int(match.group(1)), set()).add(line.get_color())
        return real_save(plt, fig, out_dir, filename, dpi)

    monkeypatch.setattr(moe_stats, "save", keep)
    moe_stats.write_plots([moe_stats.load_run(run_a), moe_stats.load_run(run_b)], str(tmp_path))
    assert sorted(colours) == list(range(6))
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({next(iter(c)) for c in colours.values()}) == 6


def test_formats_labels_layers_and_steps(cli, run_a, run_b, tmp_path, monkeypatch):
    code, out, err = cli("plot", run_a, run_b, "--out", tmp_path, "--format", "pdf,svg",
                         "--label", "no bias", "--label", "bias", "--layers", "2,3",
                         "--steps", "5:15", "--dpi", "50")
    assert code == 0, err
    names = {os.path.basename(p) for p in out.split()}
    assert names == {n.replace(".png", ext) for n in TWO_RUN_FILES for ext in (".pdf", ".svg")}
    with open(tmp_path / "balance.pdf", "rb") as f:
        assert f.read(5) == b"%PDF-"
    svg = (tmp_path / "balance.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "<!-- no bias -->" in svg and "<!-- bias -->" in svg and "layer 4" not in svg
    figures = []
    monkeypatch.setattr(moe_stats, "save", lambda plt, fig, *a: figures.append(fig) or
                        plt.close(fig) or "x.png")
    options = moe_stats.PlotOptions(layers=(2, 3), steps=(5, 15))
    moe_stats.write_plots([moe_stats.load_run(run_a)], str(tmp_path), options=options)
    heatmap = figures[0]
    assert len([ax for ax in heatmap.axes if ax.get_visible() and ax.images]) == 2
    line = figures[1].axes[0].get_lines()[0]
    assert list(line.get_xdata()) == list(range(5, 16))


@pytest.mark.parametrize("args", [["--layers", "9"], ["--steps", "30:40"], ["--label", "x",
                                                                            "--label", "y"]])
def test_bad_selection_is_an_error(cli, run_a, tmp_path, args):
    code, out, err = cli("plot", run_a, "--out", tmp_path, *args)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err


def test_figure_that_cannot_be_written(cli, run_a, tmp_path):
    # The folder exists, but a directory stands where the first figure would go.
    (tmp_path / "figures" / "expert_load_A.png").mkdir(parents=True)
    code, out, err = cli("plot", run_a, "--out", tmp_path / "figures")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "expert_load_A.png" in err and "cannot write" in err


@pytest.mark.parametrize("dpi", ["0", "-5", "x", "1201", "100000"])
def test_bad_dpi_is_a_usage_error(cli, run_a, tmp_path, dpi, capsys):
    # 100000 dpi once reached matplotlib and ended in a MemoryError traceback.
    with pytest.raises(SystemExit) as info:
        cli("plot", run_a, "--out", tmp_path / "figures", f"--dpi={dpi}")
    assert info.value.code == 2
    assert "argument --dpi" in capsys.readouterr().err
    assert not (tmp_path / "figures").exists()


def test_a_figure_without_the_memory_for_its_pixels_is_one_line(cli, run_a, tmp_path,
                                                                 monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError("std::bad_alloc")

    monkeypatch.setattr("matplotlib.figure.Figure.savefig", no_memory)
    code, out, err = cli("plot", run_a, "--out", tmp_path / "figures", "--dpi", "1200")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "cannot draw the figure (not enough memory for 1200 dpi)" in err


def test_plot_into_an_unwritable_place(cli, run_a, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, out, err = cli("plot", run_a, "--out", blocker / "sub")
    assert code == 2 and out == ""
    assert str(blocker / "sub") in err


def series_of(ax):
    """(colour, line style) of each line of `ax` with more than two points (a series, not a
    reference line), and the face colour of each filled area (stackplot)."""
    from matplotlib.colors import to_hex
    series = [(to_hex(line.get_color()), line.get_linestyle()) for line in ax.get_lines()
              if len(line.get_xdata()) > 2]
    series += [(to_hex(c.get_facecolor()[0]), "fill") for c in ax.collections
               if len(c.get_facecolor())]
    return series


def assert_distinct_series(fig, name):
    for ax in fig.axes:
        series = series_of(ax)
        assert len(set(series)) == len(series), (name, ax.get_title(), series)


def test_palette_never_repeats():
    import matplotlib
    assert moe_stats.palette(4) == tuple(tuple(matplotlib.colormaps["tab10"](i))
                                         for i in range(4))
    for count in (10, 11, 20, 21, 64, 300):
        rgb = np.array([c[:3] for c in moe_stats.palette(count)])
        assert len({tuple(np.round(255 * c).astype(int)) for c in rgb}) == count, count
        if count <= 64:       # as far apart as tab20's closest pair
            gaps = np.linalg.norm(rgb[:, None] - rgb[None], axis=2) + 9 * np.eye(count)
            assert gaps.min() > 0.09, count


def many_series_run(path, experts=24, phases=24):
    """A run of 3 layers (1 hash) of `experts` experts, with `phases` phases in /perf."""
    rng = np.random.default_rng(3)
    load = rng.integers(20, 60, size=(sf.NUM_STEPS, 3, experts))
    run = sf.build_loads_run(load, sf.WORLD, hash_layers=1)
    run["datasets"]["routing/bias"] = rng.normal(size=load.shape).astype(np.float32)
    run["datasets"]["perf/phase_time"] = rng.uniform(1e-4, 1e-3, (sf.NUM_STEPS, sf.WORLD, phases))
    run["strings"]["perf/phases"] = [f"phase{p}" for p in range(phases)]
    return moe_stats.load_run(sf.write_stats(path, run))


def test_series_colours_are_distinct_past_the_colour_cycles(tmp_path):
    # 24 experts and 24 phases: more than tab20 has colours.
    run = many_series_run(str(tmp_path / "wide.h5"))
    plt = moe_stats.pyplot()
    for draw in (moe_stats.plot_bias, moe_stats.plot_phases):
        fig = draw(plt, [run], ["wide"])
        for ax in fig.axes:
            series = series_of(ax)
            assert len(series) in (0, 24, 48), (draw.__name__, len(series))
        assert_distinct_series(fig, draw.__name__)
        plt.close(fig)


def test_run_tags_are_short(tmp_path):
    runs = [type("R", (), {"path": path})() for path in ("/x/runs/A.h5", "/x/runs/B.h5")]
    assert moe_stats.run_tags(runs) == ["A", "B"]
    runs = [type("R", (), {"path": path})() for path in ("/x/run_a.h5", "/y/old/run.h5")]
    assert moe_stats.run_tags(runs) == ["A (run_a)", "B (run)"]
    assert moe_stats.run_tags(runs[:1]) == ["run_a"]
    assert moe_stats.run_tags(runs, ("base", "new")) == ["base", "new"]


def test_ranks_and_layers_have_legends_of_their_own(run_a, run_b):
    plt = moe_stats.pyplot()
    fig = moe_stats.plot_ranks(plt, [moe_stats.load_run(run_a), moe_stats.load_run(run_b)],
                               ["A", "B"])
    legends = {legend.get_title().get_text(): [t.get_text() for t in legend.get_texts()]
               for legend in fig.legends}
    plt.close(fig)
    assert set(legends) == {"ranks (top panel)", "layers (bottom panel)"}
    assert legends["ranks (top panel)"] == ["run A", "run B", "rank 0", "rank 1"]
    assert legends["layers (bottom panel)"] == [f"layer {l}" for l in range(2, 6)] + [
        "mean over layers, run A", "mean over layers, run B"]


def loads_of_ratio(path, experts, top_k, layers):
    """A run of `layers` top-k layers whose collapse ceiling is E/K = experts/top_k."""
    rng = np.random.default_rng(5)
    load = rng.integers(0, 3 * top_k * 64 // experts, size=(sf.NUM_STEPS, layers, experts))
    run = sf.build_loads_run(load, sf.WORLD)
    run["attrs"]["top_k"] = top_k
    return moe_stats.load_run(sf.write_stats(path, run))


def boxes_overlap(a, b):
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("experts,top_k,layers,paper", [
    (4, 2, 6, False), (8, 3, 2, False), (64, 6, 1, False), (8, 3, 2, True)])
def test_colour_bar_labels_are_clear_at_150_dpi(tmp_path, experts, top_k, layers, paper):
    # E/K = 8/3: its two-line label met the tick 2.5 below it; E/K = 10.7: ticks every 0.5.
    run = loads_of_ratio(str(tmp_path / "run.h5"), experts, top_k, layers)
    options = moe_stats.PlotOptions(paper=paper)
    plt = moe_stats.pyplot()
    with plt.rc_context(options.style.rc):
        fig = moe_stats.plot_expert_load(plt, run, "A", options)
        fig.set_dpi(150)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        renderer = FigureCanvasAgg(fig).get_renderer()
        fig.draw(renderer)
    bar = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"][0]
    label = bar.yaxis.label.get_window_extent(renderer)
    ticks = [t for t in bar.get_yticklabels() if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in ticks]
    plt.close(fig)
    assert not [t.get_text() for t, box in zip(ticks, boxes) if boxes_overlap(label, box)]
    assert not [(a.get_text(), b.get_text()) for i, (a, p) in enumerate(zip(ticks, boxes))
                for b, q in zip(ticks[i + 1:], boxes[i + 1:]) if boxes_overlap(p, q)]
    values = [float(t.get_text().split()[0]) for t in ticks]
    assert values[0] == 0 and 1.0 in values and "E/K" in ticks[-1].get_text()
    assert values[-1] == pytest.approx(experts / top_k, rel=1e-2)


def pdf_page_size(path):
    """(width, height) in points of the PDF's MediaBox (matplotlib writes one page, the page
    dictionary uncompressed)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data.startswith(b"%PDF-")
    box = re.search(rb"/MediaBox\s*\[\s*([\d.\s]+)\]", data).group(1).split()
    return float(box[2]) - float(box[0]), float(box[3]) - float(box[1]), data


def test_paper_style(cli, run_a, run_b, tmp_path, monkeypatch):
    import matplotlib
    family = list(matplotlib.rcParams["font.family"])
    drawn = []
    real_save = moe_stats.save

    def keep(plt, fig, out_dir, filename, dpi, formats=("png",)):
        fonts = {t.get_fontfamily()[0] for ax in fig.axes for t in [ax.title, ax.xaxis.label]}
        drawn.append((filename, dpi, formats, tuple(fig.get_size_inches()), fonts))
        if filename.startswith("balance"):     # one written for real; the rest only drawn
            return real_save(plt, fig, out_dir, filename, dpi, formats)
        plt.close(fig)
        return [os.path.join(out_dir, f"x.{fmt}") for fmt in formats]

    monkeypatch.setattr(moe_stats, "save", keep)
    code, out, err = cli("plot", run_a, run_b, "--paper", "--out", tmp_path)
    assert code == 0, err
    assert {name for name, *_ in drawn} == {n.replace(".png", ".pdf") for n in TWO_RUN_FILES}
    for name, dpi, formats, (width, height), fonts in drawn:
        assert (dpi, formats, width, fonts) == (300, ("pdf",), 3.5, {"serif"}), name
    width, height, data = pdf_page_size(tmp_path / "balance.pdf")
    balance = [size for name, _, _, size, _ in drawn if name == "balance.pdf"][0]
    assert (width, height) == pytest.approx((252.0, 72 * balance[1]), abs=0.5)
    assert b"/FontFile2" in data and b"Serif" in data          # TrueType (Type 42), serif
    assert list(matplotlib.rcParams["font.family"]) == family   # rc_context: nothing global
    drawn.clear()          # --format and --dpi given win over the style's
    code, out, err = cli("plot", run_a, "--paper", "--format", "svg", "--dpi", "100", "--out",
                         tmp_path, "--layers", "2")
    assert code == 0, err
    assert {(dpi, formats) for _, dpi, formats, *_ in drawn} == {(100, ("svg",))}


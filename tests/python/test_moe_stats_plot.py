"""`moe_stats.py plot`: non-empty PNG, PDF and SVG files, listed on stdout, and every figure
titled, with axis labels and a legend outside the panels (a colour bar for the heatmaps, up to the
collapse ceiling E/K); --label, --layers and --steps."""
import os
import shutil
import re

import pytest

import moe_stats

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
    assert "run no bias" in svg and "run bias" in svg and "layer 4" not in svg
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

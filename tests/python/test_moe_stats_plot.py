"""`moe_stats.py plot`: non-empty PNG files, listed on stdout, and every figure titled, with axis
labels and a legend (a colour bar for the heatmaps)."""
import os

import pytest

import moe_stats

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TWO_RUN_FILES = {"expert_load_A.png", "expert_load_B.png", "balance.png", "bias.png",
                 "ranks.png", "loss.png"}


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
        legends = [ax.get_legend() for ax in plots if ax.get_legend() is not None]
        assert legends or colorbars, name
        if colorbars:
            assert colorbars[0].get_ylabel(), name


def test_figure_that_cannot_be_written(cli, run_a, tmp_path):
    # The folder exists, but a directory stands where the first figure would go.
    (tmp_path / "figures" / "expert_load_A.png").mkdir(parents=True)
    code, out, err = cli("plot", run_a, "--out", tmp_path / "figures")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "expert_load_A.png" in err and "cannot write" in err


@pytest.mark.parametrize("dpi", ["0", "-5", "x"])
def test_bad_dpi_is_a_usage_error(cli, run_a, tmp_path, dpi):
    with pytest.raises(SystemExit) as info:
        cli("plot", run_a, "--out", tmp_path / "figures", f"--dpi={dpi}")
    assert info.value.code == 2


def test_plot_into_an_unwritable_place(cli, run_a, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, out, err = cli("plot", run_a, "--out", blocker / "sub")
    assert code == 2 and out == ""
    assert str(blocker / "sub") in err

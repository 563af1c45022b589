"""The pieces the figures of `plot` and `compare` are built from: pyplot on the Agg backend, a
grid of panels, the step axis (with the start of each file of a resumed run marked), legends
outside the panels, saving in several formats with one-line errors, and the expert-load heatmaps
with their colour bar (load / mean load from 0 to the collapse ceiling E/K, white at 1, tick
labels thinned until none meets another).

matplotlib is imported only when drawing. Shapes: n steps drawn, E experts.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .figure_style import SCREEN
from .metrics import collapse_ceiling
from .stats_file import StatsError


def pyplot():
    """matplotlib.pyplot on the Agg backend; the style's fonts come in through rc_context where
    the figures are drawn (write_plots), never through the global rcParams."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def panel_grid(plt, count, title, ncols=4, width=3.4, height=2.5, style=SCREEN):
    """A grid of `count` panels of width x height inches, ncols a row; in the paper style as many
    as style.panel_cols a row, filling the column's width."""
    if style.panel_height:
        ncols = style.panel_cols
        width = style.width / min(count, ncols)
        height = style.panel_height
    ncols = min(count, ncols)
    nrows = math.ceil(count / ncols)
    title_room = 0.4 if style.panel_height else 0.7
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows + title_room),
                             squeeze=False, layout="constrained")
    for ax in axes.reshape(-1)[count:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes.reshape(-1)


def step_axis(ax, runs=(), bins=6):
    from matplotlib.ticker import MaxNLocator
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=bins))
    mark_resumes(ax, runs)


def mark_resumes(ax, runs):
    """A dotted vertical line before the first step of each file after the first of a run."""
    for run in runs:
        steps = run.steps
        for segment in run.segments[1:]:
            if segment.rows and len(steps) and steps[0] < segment.first_step <= steps[-1]:
                ax.axvline(segment.first_step - 0.5, color="0.5", ls=":", lw=1.0)


def legend_outside(fig, axes, handles=None, style=SCREEN, second=False, title=None):
    """A legend for the figure outside the panels (constrained layout makes room): right of them
    on screen, below them in the paper style; second=True: the style's second place (right and
    lower on screen, above the panels in the paper style), for a figure with two legends."""
    if handles is None:
        seen = {}
        for ax in np.atleast_1d(axes):
            for handle, label in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(label, handle)
        handles = list(seen.values())
        labels = list(seen)
    else:
        labels = [h.get_label() for h in handles]
    if handles:
        fig.legend(handles, labels, loc=style.legend_locs[1 if second else 0], frameon=False,
                   ncols=min(style.legend_cols, len(handles)), title=title)


def save(plt, fig, out_dir, filename, dpi, formats=("png",)):
    """Saves `fig` as out_dir/filename's stem in each format, closes it; returns the paths (one
    path, a string, when one format is asked)."""
    stem = os.path.splitext(filename)[0]
    paths = []
    try:
        for fmt in formats:
            path = os.path.join(out_dir, f"{stem}.{fmt}")
            try:
                fig.savefig(path, dpi=dpi, format=fmt,
                            metadata={"Date": None} if fmt == "svg" else None)
            except OSError as err:
                raise StatsError(f"{path}: cannot write the figure ({err.strerror or err})") \
                    from None
            except ValueError as err:  # e.g. an image too large for the --dpi asked
                raise StatsError(f"{path}: cannot draw the figure ({err})") from None
            except MemoryError:
                raise StatsError(f"{path}: cannot draw the figure (not enough memory for "
                                 f"{dpi} dpi)") from None
            paths.append(path)
    finally:
        plt.close(fig)
    return paths[0] if len(paths) == 1 else paths


def load_norm(run, rel):
    """(top, norm) of the load / mean load heatmaps of `run` (rel: its load ratios): white at 1,
    up to the collapse ceiling E/K (or the largest ratio, at least 2, where K is unknown)."""
    top = collapse_ceiling(run) or max(2.0, float(np.max(rel)))
    return top, ratio_norm(top)


def ratio_norm(top):
    """The colour scale of load / mean load: 0 to `top`, white at 1."""
    from matplotlib.colors import TwoSlopeNorm
    return TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=max(top, 1.0 + 1e-9))


def load_heatmap(ax, run, steps, rel, norm, cmap="RdBu_r"):
    """rel [n, E] (one layer's values at `steps`) as experts x steps on `ax`; the image."""
    extent = [steps[0] - 0.5, steps[-1] + 0.5, -0.5, rel.shape[1] - 0.5]
    image = ax.imshow(rel.T, aspect="auto", origin="lower", extent=extent, cmap=cmap, norm=norm,
                      interpolation="nearest")
    step_axis(ax, [run])
    ax.set_ylabel("expert")
    if rel.shape[1] <= 16:
        ax.set_yticks(range(rel.shape[1]))
    return image


# Points between the colour bar's tick labels and its label, and the least gap between two tick
# labels (at 150 dpi, the two-line E/K label once met the tick 2.5 below it, and a ceiling of
# 10.7 packed ticks every 0.5 into one black smear).
COLORBAR_LABELPAD = 6.0
TICK_LABEL_GAP = 1.5
LINE_HEIGHT = 1.2    # of a line of text, in font sizes (matplotlib's line spacing)


def load_colorbar(fig, image, axes, top, collapse, **place):
    """The colour bar of the load heatmaps: 0, 0.5, 1 and round values up to `top`, the top
    marked (collapse: it is E/K), as many of them as have room for their labels (spaced_locator).
    place: fig.colorbar's fraction, aspect, location and the like."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties
    from matplotlib.ticker import FuncFormatter, MaxNLocator
    bar = fig.colorbar(image, ax=list(axes), **place)
    bar.set_label("load / mean load (1 = balanced)", labelpad=COLORBAR_LABELPAD)
    upper = [t for t in MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(1.0, top)
             if 1.0 < t < top]
    # Kept first: the top, 1 (balanced), 0; then the round values, 0.5 last.
    labels = {top: f"{top:.3g} = E/K\n(collapse)" if collapse else f"{top:.3g}"}
    for tick in [1.0, 0.0] + [float(t) for t in upper] + [0.5]:
        labels.setdefault(tick, f"{tick:g}")
    vertical = bar.orientation == "vertical"
    font = FontProperties(size=rcParams["ytick.labelsize" if vertical else "xtick.labelsize"])
    bar.locator = spaced_locator(labels, font)
    bar.formatter = FuncFormatter(lambda value, _: labels.get(value, f"{value:g}"))
    mark = bar.ax.axhline if vertical else bar.ax.axvline
    mark(top, color="black", lw=2.0)
    return bar


def spaced_locator(labels, font):
    """A matplotlib Locator of the values of `labels` ({value: label}, in the order they are kept
    first) that keeps a value while its label, in `font`, clears the labels kept before it by
    TICK_LABEL_GAP along the axis. It runs when the axis is drawn, after the layout: whatever the
    figure's size and dpi, no label meets another (and no layout pass is spent beforehand)."""
    from matplotlib.textpath import TextToPath
    from matplotlib.ticker import Locator

    def extent(text, vertical):
        """The label's size along the axis, in points."""
        lines = text.split("\n")
        if vertical:
            return len(lines) * LINE_HEIGHT * font.get_size_in_points()
        return max(TextToPath().get_text_width_height_descent(line, font, ismath=False)[0]
                   for line in lines)

    class SpacedLocator(Locator):
        def __call__(self):
            return self.tick_values(*self.axis.get_view_interval())

        def tick_values(self, vmin, vmax):
            axes, vertical = self.axis.axes, self.axis.axis_name == "y"
            scale = axes.figure.dpi / 72.0          # points to display units
            kept = []                                # (value, first, last display unit)
            for value, text in labels.items():
                if not min(vmin, vmax) <= value <= max(vmin, vmax):
                    continue
                point = axes.transData.transform((0.0, value) if vertical else (value, 0.0))
                centre = point[1] if vertical else point[0]
                half = (extent(text, vertical) / 2.0 + TICK_LABEL_GAP) * scale
                if all(centre + half <= first or centre - half >= last
                       for _, first, last in kept):
                    kept.append((value, centre - half, centre + half))
            return sorted(value for value, _, _ in kept)

    return SpacedLocator()


def keeper(plt, out_dir, options, save, paths):
    """keep(fig, name): saves fig (None: nothing) as out_dir/name in options.formats through
    `save`, adding the paths written to `paths`."""
    def keep(fig, name):
        if fig is None:
            return
        args = (plt, fig, out_dir, f"{name}.{options.formats[0]}", options.dpi)
        result = save(*args) if options.formats == ("png",) else save(
            *args, formats=options.formats)
        paths.extend([result] if isinstance(result, str) else result)
    return keep

"""The figures of `moe_stats.py compare`:

    compare.EXT               a panel each, the steps shared: training loss, validation loss
                              (when some run has validation rows), the worst max violation over
                              the compared layers (compare.compared_layers), and the drop rate
                              (when some run has a token capacity); a colour per run
                              (figure_style.palette), one legend of run labels.
    expert_load_diff_I.EXT    for each run I = 2, 3, ... against run 1 (the first named): a row
                              per compared layer, run 1's heatmap of load / mean load, run I's,
                              and run I's minus run 1's on a diverging map centred at 0 (the
                              same limits in every row), over the steps both runs have.

Drawn in PlotOptions.style (the paper style with --paper) through rc_context, saved through
`save` as plot.write_plots does.

Shapes: N complete rows (steps), L layers, E experts.
"""
from __future__ import annotations

import os

import numpy as np

from .figure_parts import (COLORBAR_LABELPAD, keeper, legend_outside, load_colorbar,
                           load_heatmap, load_norm, pyplot, ratio_norm, step_axis)
from .compare import has_validation, layers_phrase
from .figure_style import palette
from .metrics import capacity_on, collapse_ceiling, layer_metrics, load_ratio, step_drop_rate
from .stats_file import StatsError

DIFF_CMAP = "PuOr_r"   # diverging, and not the loads' RdBu_r, so the two scales are not confused


def plot_compare(plt, runs, labels, layers, options):
    """The lines figure: loss, validation loss, worst max violation, drop rate, x = step."""
    with_eval = any(has_validation(run) for run in runs)
    with_drops = any(capacity_on(run) and "routing/dropped" in run.data for run in runs)
    panels = 2 + with_eval + with_drops
    style = options.style
    fig, axes = plt.subplots(panels, 1, sharex=True, layout="constrained",
                             figsize=style.figsize(1.0 + 2.2 * panels))
    axes = list(axes)
    colors = palette(len(runs))
    ax = axes.pop(0)
    for run, label, color in zip(runs, labels, colors):
        ax.plot(run.steps, run.data["steps/loss"], color=color, lw=1.3, label=label)
    ax.set_title("Training loss (LM cross-entropy)")
    ax.set_ylabel("loss (nats/token)")
    lines_axes = [ax]
    if with_eval:
        ax = axes.pop(0)
        for run, color in zip(runs, colors):
            if run.eval and len(run.eval["eval/step"]):
                ax.plot(run.eval["eval/step"], run.eval["eval/loss"], "o-", color=color, lw=1.3)
        ax.set_title("Validation loss")
        ax.set_ylabel("loss (nats/token)")
        lines_axes.append(ax)
    ax = axes.pop(0)
    for run, color in zip(runs, colors):
        ax.plot(run.steps, layer_metrics(run)["violation"][:, layers].max(axis=1), color=color,
                lw=1.3)
    ax.set_title(f"Worst max violation ({layers_phrase(runs, layers)})")
    ax.set_ylabel("(max − mean) / mean")
    lines_axes.append(ax)
    if with_drops:
        from matplotlib.ticker import PercentFormatter
        ax = axes.pop(0)
        for run, color in zip(runs, colors):
            if capacity_on(run) and "routing/dropped" in run.data:
                ax.plot(run.steps, step_drop_rate(run), color=color, lw=1.3)
        ax.set_title("Dropped by the token capacity (all layers)")
        ax.set_ylabel("dropped / selected (%)")
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax.set_ylim(bottom=0.0)
        lines_axes.append(ax)
    for ax in lines_axes:
        step_axis(ax, runs)
        ax.grid(alpha=0.3)
    for ax in lines_axes[:-1]:
        ax.set_xlabel("")
    legend_outside(fig, [lines_axes[0]], style=style, title="runs")
    return fig


def common_steps(run_a, run_b):
    """(steps, rows of A, rows of B): the steps both runs have."""
    steps, rows_a, rows_b = np.intersect1d(run_a.steps, run_b.steps, return_indices=True)
    return steps, rows_a, rows_b


def plot_load_difference(plt, ref, other, labels, layers, options):
    """Rows of (run 1, run I, run I − run 1) load / mean load heatmaps, one row per layer, over
    the steps both have; None when they have none in common."""
    steps, rows_ref, rows_other = common_steps(ref, other)
    if len(steps) == 0:
        return None
    rel_ref = load_ratio(ref.data["routing/expert_load"][rows_ref])         # [n, L, E]
    rel_other = load_ratio(other.data["routing/expert_load"][rows_other])
    diff = rel_other - rel_ref
    # One scale for both runs: up to the larger top (their K may differ).
    top = max(load_norm(ref, rel_ref)[0], load_norm(other, rel_other)[0])
    norm = ratio_norm(top)
    from matplotlib.colors import Normalize
    from matplotlib.ticker import MaxNLocator
    limit = float(np.abs(diff[:, layers]).max()) or 1.0
    diff_norm = Normalize(vmin=-limit, vmax=limit)
    style = options.style
    # Heights: a row per layer, and room for the title and the two colour bars below.
    size = (style.width, 1.05 * len(layers) + 1.5) if style.paper else \
        (10.0, 2.0 * len(layers) + 1.8)
    fig, axes = plt.subplots(len(layers), 3, figsize=size, layout="constrained", squeeze=False,
                             sharex=True, sharey=True)
    for row, layer in enumerate(layers):
        loads = load_heatmap(axes[row, 0], ref, steps, rel_ref[:, layer, :], norm)
        load_heatmap(axes[row, 1], other, steps, rel_other[:, layer, :], norm)
        diffs = load_heatmap(axes[row, 2], other, steps, diff[:, layer, :], diff_norm,
                             cmap=DIFF_CMAP)
        for ax in axes[row]:
            step_axis(ax, bins=3 if style.paper else 6)
        axes[row, 0].set_ylabel(f"layer {layer}\nexpert")
    for ax, name in zip(axes[0], (labels[0], labels[1], f"{labels[1]} − {labels[0]}")):
        ax.set_title(name)
    for ax in axes.flat:
        ax.label_outer()
    # Under the panels, each bar under the columns it colours.
    load_colorbar(fig, loads, axes[:, :2].reshape(-1), top,
                  top in (collapse_ceiling(ref), collapse_ceiling(other)), location="bottom",
                  aspect=30)
    bar = fig.colorbar(diffs, ax=list(axes[:, 2]), location="bottom", aspect=15)
    bar.set_label("difference", labelpad=COLORBAR_LABELPAD)
    bar.ax.xaxis.set_major_locator(MaxNLocator(nbins=4, symmetric=True))
    fig.suptitle(f"Expert load / mean load: {labels[1]} against {labels[0]},\nsteps "
                 f"{int(steps[0])}..{int(steps[-1])} (those both runs have)")
    return fig


def write_compare_figures(runs, labels, layers, out_dir, options, save, warn):
    """Writes compare.EXT and expert_load_diff_I.EXT (I = 2..) into out_dir; returns the paths.
    warn(message): a run without steps in common with run 1 gets no difference figure."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise StatsError(f"{out_dir}: cannot create the output folder ({err.strerror})") from None
    plt = pyplot()
    paths = []
    keep = keeper(plt, out_dir, options, save, paths)
    with plt.rc_context(options.style.rc):
        keep(plot_compare(plt, runs, labels, layers, options), "compare")
        for i, run in enumerate(runs[1:], start=2):
            fig = plot_load_difference(plt, runs[0], run, (labels[0], labels[i - 1]), layers,
                                       options)
            if fig is None:
                warn(f"{run.path}: no step in common with {runs[0].path}; no "
                     f"expert_load_diff_{i} figure")
            keep(fig, f"expert_load_diff_{i}")
    return paths

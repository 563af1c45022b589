"""`moe_stats.py plot`: PNG figures of one run or two side by side (A solid, B dashed): expert-load
heatmaps, variance and max violation, bias trajectories, per-rank load and overload, loss. A
resumed run is drawn whole, with a dotted line where each of its files starts; ranks a file did
not have (NaN in its rank axis) leave gaps in their lines.

Each plot_* function draws one figure and returns it (None where there is nothing to draw);
write_plots saves them through `save`, which a caller may replace (the tests do, to inspect the
figures before they are closed). matplotlib is imported only when plotting.

Shapes: N complete rows (steps), L layers, E experts, W ranks.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .stats_file import (StatsError, balance_layers, check_same_shape, entropy_floor,
                         rank_overload, routing_label, topk_mask)

def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def run_tags(runs):
    tags = ["A", "B"]
    return [f"{tags[i]} ({run.name})" if len(runs) > 1 else run.name
            for i, run in enumerate(runs)]


def panel_grid(plt, count, title):
    ncols = min(count, 4)
    nrows = math.ceil(count / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 2.5 * nrows + 0.7),
                             squeeze=False, constrained_layout=True)
    for ax in axes.reshape(-1)[count:]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig, axes.reshape(-1)


def step_axis(ax, runs=()):
    from matplotlib.ticker import MaxNLocator
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    mark_resumes(ax, runs)


def mark_resumes(ax, runs):
    """A dotted vertical line before the first step of each file after the first of a run."""
    for run in runs:
        for segment in run.segments[1:]:
            if segment.rows:
                ax.axvline(segment.first_step - 0.5, color="0.5", ls=":", lw=1.0)


def save(plt, fig, out_dir, filename, dpi):
    path = os.path.join(out_dir, filename)
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as err:
        raise StatsError(f"{path}: cannot write the figure ({err.strerror or err})") from None
    except ValueError as err:  # e.g. an image too large for the --dpi asked
        raise StatsError(f"{path}: cannot draw the figure ({err})") from None
    finally:
        plt.close(fig)
    return path


def plot_expert_load(plt, run, tag):
    """Heatmaps, one panel per layer: load / mean load, experts x steps."""
    load = run.data["routing/expert_load"].astype(np.float64)          # [N, L, E]
    mean = load.mean(axis=2, keepdims=True)
    rel = np.divide(load, mean, out=np.ones_like(load), where=mean > 0)
    steps = run.steps
    extent = [steps[0] - 0.5, steps[-1] + 0.5, -0.5, run.num_experts - 0.5]
    fig, axes = panel_grid(plt, run.num_layers, f"Expert load / mean load per layer, run {tag}")
    for layer, ax in enumerate(axes[:run.num_layers]):
        image = ax.imshow(rel[:, layer, :].T, aspect="auto", origin="lower", extent=extent,
                          cmap="coolwarm", vmin=0.0, vmax=2.0, interpolation="nearest")
        ax.set_title(f"layer {layer} ({routing_label(run.routing[layer])})", fontsize=9)
        step_axis(ax, [run])
        ax.set_ylabel("expert")
    fig.colorbar(image, ax=list(axes[:run.num_layers]), label="load / mean load (1 = balanced)")
    return fig


def plot_layer_lines(ax, run, values, style, tag, label_layers):
    """values [N, L]: thin lines for the balance layers, a thick line for their mean."""
    layers = balance_layers(run)
    for i, layer in enumerate(layers):
        label = f"{tag} layer {layer}" if label_layers else None
        ax.plot(run.steps, values[:, layer], style, color=f"C{i % 10}", lw=0.9, alpha=0.8,
                label=label)
    ax.plot(run.steps, values[:, layers].mean(axis=1), style, color="black", lw=2.0,
            label=f"{tag} mean over layers")


def plot_balance(plt, runs, tags):
    fig, (ax_var, ax_viol) = plt.subplots(2, 1, figsize=(8, 7), constrained_layout=True)
    label_layers = len(balance_layers(runs[0])) <= 8
    for run, tag, style in zip(runs, tags, ["-", "--"]):
        plot_layer_lines(ax_var, run, run.data["routing/load_variance"], style, tag, label_layers)
        plot_layer_lines(ax_viol, run, run.data["routing/max_violation"], style, tag,
                         label_layers)
    kind = "top-k" if topk_mask(runs[0]).any() else "all"
    ax_var.set_title(f"Load variance over experts ({kind} layers)")
    ax_var.set_ylabel("variance of expert load")
    ax_viol.set_title(f"Max violation (max - mean)/mean ({kind} layers)")
    ax_viol.set_ylabel("max violation")
    for ax in (ax_var, ax_viol):
        step_axis(ax, runs)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    return fig


def plot_bias(plt, runs, tags):
    # Layers that route top-k in either run (outside top-k layers a run's bias stays 0).
    layers = np.nonzero(np.logical_or.reduce([topk_mask(run) for run in runs]))[0]
    if layers.size == 0:
        return None
    fig, axes = panel_grid(plt, layers.size, "Router bias per expert (top-k layers)")
    styles = ["-", "--"]
    for ax, layer in zip(axes, layers):
        for run, style in zip(runs, styles):
            bias = run.data["routing/bias"][:, layer, :]
            for e in range(run.num_experts):
                ax.plot(run.steps, bias[:, e], style, color=f"C{e % 10}", lw=1.0)
        ax.set_title(f"layer {layer}", fontsize=9)
        step_axis(ax, runs)
        ax.set_ylabel("bias")
        ax.grid(alpha=0.3)
    # One legend for the figure: colour = expert, line style = run (readable at any size).
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color="0.3", ls=style, label=tag) for tag, style in zip(tags, styles)]
    if runs[0].num_experts <= 16:
        handles += [Line2D([], [], color=f"C{e % 10}", label=f"expert {e}")
                    for e in range(runs[0].num_experts)]
    axes[0].legend(handles=handles, fontsize=7, ncol=2, loc="best")
    return fig


def plot_ranks(plt, runs, tags):
    fig, (ax_load, ax_over) = plt.subplots(2, 1, figsize=(8, 7), constrained_layout=True)
    for run, tag, style in zip(runs, tags, ["-", "--"]):
        per_rank = run.data["routing/rank_load"].sum(axis=1)              # [N, W]
        for r in range(per_rank.shape[1]):
            ax_load.plot(run.steps, per_rank[:, r], style, color=f"C{r % 10}", lw=1.0,
                         label=f"{tag.split()[0]} rank {r}" if per_rank.shape[1] <= 16 else None)
        plot_layer_lines(ax_over, run, rank_overload(run), style, tag,
                         len(balance_layers(run)) <= 8)
    ax_load.set_title("Assignments received per rank (all layers)")
    ax_load.set_ylabel("assignments")
    kind = "top-k" if topk_mask(runs[0]).any() else "all"
    ax_over.set_title(f"Rank overload factor, most loaded rank ({kind} layers)")
    ax_over.set_ylabel("rank overload")
    for ax in (ax_load, ax_over):
        step_axis(ax, runs)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    return fig


def plot_loss(plt, runs, tags):
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    for run, tag, style in zip(runs, tags, ["-", "--"]):
        ax.plot(run.steps, run.data["steps/loss"], style, lw=1.5, label=f"{tag} loss")
    floor = entropy_floor(runs[0])
    if floor is not None:
        ax.axhline(floor, color="gray", ls=":", label=f"entropy floor {floor:.3f}")
    ax.set_title("Training loss (LM cross-entropy)")
    step_axis(ax, runs)
    ax.set_ylabel("loss (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def write_plots(runs, out_dir, dpi=80, save=save):
    """Writes every figure into out_dir, each saved (and closed) as soon as it is drawn, through
    save(plt, fig, out_dir, filename, dpi); returns the paths written."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise StatsError(f"{out_dir}: cannot create the output folder ({err.strerror})") from None
    if len(runs) > 1:
        check_same_shape(runs[0], runs[1])
    plt = pyplot()
    tags = run_tags(runs)
    paths = []
    for i, (run, tag) in enumerate(zip(runs, tags)):
        fig = plot_expert_load(plt, run, tag)
        paths.append(save(plt, fig, out_dir, f"expert_load_{'AB'[i]}.png", dpi))
    for filename, draw in (("balance.png", plot_balance), ("bias.png", plot_bias),
                           ("ranks.png", plot_ranks), ("loss.png", plot_loss)):
        fig = draw(plt, runs, tags)
        if fig is not None:   # plot_bias draws nothing without top-k layers
            paths.append(save(plt, fig, out_dir, filename, dpi))
    return paths

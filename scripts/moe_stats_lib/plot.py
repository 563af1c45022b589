"""`moe_stats.py plot`: figures of one run or two side by side (A solid, B dashed): expert-load
heatmaps, variance and max violation, the load-distribution metrics, for runs with a token
capacity (--capacity-factor) the share of assignments dropped, bias trajectories, per-rank load
and overload, loss, phase times, and for runs with --shadow the shadow balancers' worst max
violation against the run's own. PNG, PDF or SVG (PlotOptions.formats), for papers: units on
every axis (none on ratios), one colour per layer in every figure (layer_color), no colour twice
among the series of a figure (figure_style.palette), legends outside the data, runs named by
short labels (figure_style.short_labels), and the heatmaps' colour scale running up to the
collapse ceiling E/K. PlotOptions.paper draws in the paper style (figure_style.PAPER: one column
wide, serif) instead of the screen style, through rc_context only. A resumed run is drawn whole,
with a dotted line where each of its files starts; ranks a file did not have (NaN in its rank
axis) leave gaps in their lines.

Each plot_* function draws one figure and returns it (None where there is nothing to draw);
write_plots saves them through `save`, which a caller may replace (the tests do, to inspect the
figures before they are closed). matplotlib is imported only when plotting.

Shapes: N complete rows (steps), L layers, E experts, W ranks.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

# pyplot, panel_grid, step_axis, mark_resumes and save are re-exported (moe_stats.py).
from .figure_parts import (keeper, legend_outside, load_colorbar, load_heatmap, load_norm,
                           mark_resumes, panel_grid, pyplot, save, step_axis)
from .figure_style import PAPER, SCREEN, palette, short_labels
from .metrics import capacity_on, collapse_ceiling, layer_metrics, load_ratio, step_drop_rate
from .shadows import REAL, policy_violations, worst_over_layers
from .stats_file import (StatsError, balance_layers, check_same_shape, entropy_floor,
                         rank_overload, routing_label, shadow_rules, topk_mask)

FORMATS = ("png", "pdf", "svg")
STYLES = ("-", "--")


@dataclasses.dataclass(frozen=True)
class PlotOptions:
    formats: tuple = ("png",)   # any of FORMATS
    dpi: int = 80               # PNG resolution (and of the heatmaps' pixels in PDF and SVG)
    labels: tuple = ()          # names of run A, run B (default: short_labels of their files)
    layers: tuple = ()          # layers drawn (default: all, or the top-k ones where it says)
    steps: tuple = ()           # (first, last) steps drawn, inclusive (default: all)
    paper: bool = False         # the paper style (figure_style.PAPER) instead of the screen one

    @property
    def style(self):
        return PAPER if self.paper else SCREEN


def run_tags(runs, labels=()):
    """Names of the runs in titles and legends: `labels`, else the short labels of their files,
    led by A and B when there are two (A (run_a), B (run_b); just A and B for files A.h5, B.h5)."""
    if labels:
        return list(labels)
    names = short_labels([run.path for run in runs])
    if len(runs) == 1:
        return names
    return [tag if name == tag else f"{tag} ({name})" for tag, name in zip("AB", names)]


def layer_color(layer, num_layers):
    """The colour of layer `layer` in every figure: palette(num_layers)'s, no two layers alike
    (tab10 up to 10 layers, tab20 up to 20, then generated)."""
    return palette(num_layers)[layer]


# ---------------------------------------------------------------------------------------------
# Selection


def select_steps(run, first, last):
    """`run` cut to the rows whose step is in [first, last]; StatsError when none is."""
    keep = (run.steps >= first) & (run.steps <= last)
    if not keep.any():
        raise StatsError(f"{run.path}: no step in {first}..{last} (it holds steps "
                         f"{int(run.steps[0])}..{int(run.steps[-1])})")
    return dataclasses.replace(run, data={k: v[keep] for k, v in run.data.items()})


def drawn_layers(run, options, balance_only=False):
    """Layers drawn: --layers (checked against L), else all (balance_only: the top-k ones, or all
    when there are none)."""
    if options.layers:
        bad = [l for l in options.layers if not 0 <= l < run.num_layers]
        if bad:
            raise StatsError(f"--layers: {run.path} has layers 0..{run.num_layers - 1}, not "
                             f"{bad[0]}")
        return np.asarray(options.layers)
    return balance_layers(run) if balance_only else np.arange(run.num_layers)


def layers_word(run, options):
    if options.layers:
        return "selected layers"
    return "top-k layers" if topk_mask(run).any() else "all layers"


# ---------------------------------------------------------------------------------------------
# Figures


def plot_expert_load(plt, run, tag, options=PlotOptions()):
    """Heatmaps, one panel per layer: load / mean load, experts x steps, on a colour scale from 0
    to the collapse ceiling E/K (1 = balanced)."""
    layers = drawn_layers(run, options)
    rel = load_ratio(run.data["routing/expert_load"])                  # [N, L, E]
    ceiling, norm = load_norm(run, rel)
    fig, axes = panel_grid(plt, len(layers), f"Expert load / mean load per layer, run {tag}",
                           style=options.style)
    for ax, layer in zip(axes, layers):
        image = load_heatmap(ax, run, run.steps, rel[:, layer, :], norm)
        # One column wide, the long routing names would run into the next panel's title.
        kind = (PAPER_ROUTING.get(run.routing[layer], run.routing[layer]) if options.paper
                else routing_label(run.routing[layer]))
        ax.set_title(f"layer {layer} ({kind})", color=layer_color(layer, run.num_layers))
    place = {"fraction": 0.06, "aspect": 40} if options.paper else {}
    load_colorbar(fig, image, axes[:len(layers)], ceiling, collapse_ceiling(run) is not None,
                  **place)
    return fig


PAPER_ROUTING = {"hash": "hash", "topk": "top-k", "forced": "forced"}


def plot_layer_lines(ax, run, values, style, tag, layers, label_layers=True, mean=True):
    """values [N, L]: a line per layer in `layers` (its colour), and a thick black mean."""
    for layer in layers:
        label = f"layer {layer}" if label_layers else None
        ax.plot(run.steps, values[:, layer], style, color=layer_color(layer, run.num_layers),
                lw=1.0, alpha=0.9, label=label)
    if mean and len(layers) > 1:
        ax.plot(run.steps, np.nanmean(values[:, layers], axis=1), style, color="black", lw=2.0,
                label=f"{tag}: mean over layers")


def run_name(tag):
    """A run's name in a legend: "run A" for a bare letter, else the tag itself ("no balancing",
    "A (run_a)")."""
    return f"run {tag}" if len(tag) == 1 else tag


def run_style_handles(tags):
    from matplotlib.lines import Line2D
    return [Line2D([], [], color="0.3", ls=style, label=run_name(tag))
            for tag, style in zip(tags, STYLES)]


def layer_handles(run, layers):
    from matplotlib.lines import Line2D
    return [Line2D([], [], color=layer_color(l, run.num_layers), label=f"layer {l}")
            for l in layers]


def mean_handles(tags, layers):
    from matplotlib.lines import Line2D
    if len(layers) < 2:
        return []
    return [Line2D([], [], color="black", lw=2.0, ls=style, label="mean over layers"
                   + (f", {run_name(tag)}" if len(tags) > 1 else ""))
            for tag, style in zip(tags, STYLES)]


def balance_legend(fig, runs, tags, layers, style=SCREEN):
    handles = (run_style_handles(tags) if len(runs) > 1 else []) + layer_handles(runs[0], layers)
    handles += mean_handles(tags, layers)
    legend_outside(fig, None, handles, style)


def plot_balance(plt, runs, tags, options=PlotOptions()):
    fig, (ax_var, ax_viol) = plt.subplots(2, 1, figsize=options.style.figsize(6.5),
                                          layout="constrained")
    layers = drawn_layers(runs[0], options, balance_only=True)
    for run, tag, style in zip(runs, tags, STYLES):
        metrics = layer_metrics(run)
        plot_layer_lines(ax_var, run, metrics["variance"], style, tag, layers)
        plot_layer_lines(ax_viol, run, metrics["violation"], style, tag, layers)
    word = layers_word(runs[0], options)
    ax_var.set_title(f"Load variance over experts ({word})")
    ax_var.set_ylabel("variance (assignments²)")
    ax_viol.set_title(f"Max violation (max − mean) / mean ({word})")
    ax_viol.set_ylabel("max violation (fraction of mean)")
    ceiling = collapse_ceiling(runs[0])
    if ceiling is not None and ax_viol.get_ylim()[1] > 0.8 * (ceiling - 1):
        ax_viol.axhline(ceiling - 1, color="0.3", ls="-.", lw=1.0)
        ax_viol.annotate(f"E/K − 1 = {ceiling - 1:.3g} (collapse)", (0.02, ceiling - 1),
                         xycoords=("axes fraction", "data"), va="bottom", fontsize=7)
    for ax in (ax_var, ax_viol):
        step_axis(ax, runs)
        ax.grid(alpha=0.3)
    balance_legend(fig, runs, tags, layers, options.style)
    return fig


# (dataset of layer_metrics, title, y label). Ratios are dimensionless: the label says what is
# divided by what, and carries no unit.
METRIC_PANELS = (
    ("cv", "Coefficient of variation", "std / mean"),
    ("max_ratio", "Most loaded expert", "max / mean load"),
    ("min_ratio", "Least loaded expert", "min / mean load"),
    ("dead", "Dead experts (load 0)", "experts"),
    ("diversity", "Expert diversity exp(H) / E", "fraction of experts"),
    ("balance_loss", "Balance loss per layer", "balance loss"),
    ("bias_spread", "Router bias spread", "max − min bias"),
    ("rank_overload", "Rank overload", "max / mean rank load"),
)


def plot_metrics(plt, runs, tags, options=PlotOptions()):
    """The load-distribution metrics of metrics.py, a panel each, a line per layer."""
    layers = drawn_layers(runs[0], options)
    word = "selected layers" if options.layers else "all layers"
    fig, axes = panel_grid(plt, len(METRIC_PANELS), f"Expert-load metrics per layer ({word})",
                           width=3.0, height=2.4, style=options.style)
    for run, tag, style in zip(runs, tags, STYLES):
        metrics = layer_metrics(run)
        mean = run.data["routing/expert_load"].astype(np.float64).mean(axis=2)
        metrics["min_ratio"] = np.divide(metrics["min"], mean, out=np.ones_like(mean),
                                         where=mean > 0)
        for ax, (name, _, _) in zip(axes, METRIC_PANELS):
            plot_layer_lines(ax, run, metrics[name], style, tag, layers, mean=False)
    ceiling = collapse_ceiling(runs[0])
    for ax, (name, title, ylabel) in zip(axes, METRIC_PANELS):
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        step_axis(ax, runs)
        ax.grid(alpha=0.3)
        if name == "max_ratio" and ceiling is not None:
            ax.axhline(ceiling, color="0.3", ls="-.", lw=1.0)
            ax.annotate(f"E/K = {ceiling:.3g} (collapse)", (0.02, ceiling),
                        xycoords=("axes fraction", "data"), va="bottom", fontsize=7)
            ax.set_ylim(bottom=1.0, top=ceiling * 1.08)
        if name == "dead":
            from matplotlib.ticker import MaxNLocator
            most = max(float(np.nanmax(layer_metrics(run)["dead"][:, layers])) for run in runs)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylim(-0.3, max(most, 1.0) + 0.3)
    handles = (run_style_handles(tags) if len(runs) > 1 else []) + layer_handles(runs[0], layers)
    legend_outside(fig, None, handles, options.style)
    return fig


def plot_drop_rate(plt, runs, tags, options=PlotOptions()):
    """The share of the selected assignments that the token capacity dropped at each step: a
    line per layer (its colour) and the overall rate over all layers (black, thick); None when no
    run had a capacity (capacity_on) or none counts its drops (/routing/dropped)."""
    drawn = [(run, tag, style) for run, tag, style in zip(runs, tags, STYLES)
             if capacity_on(run) and "routing/dropped" in run.data]
    if not drawn:
        return None
    from matplotlib.ticker import PercentFormatter
    layers = drawn_layers(runs[0], options)
    fig, ax = plt.subplots(figsize=options.style.figsize(4.2), layout="constrained")
    for run, tag, style in drawn:
        plot_layer_lines(ax, run, layer_metrics(run)["drop_rate"], style, tag, layers,
                         mean=False)
        ax.plot(run.steps, step_drop_rate(run), style, color="black", lw=2.0)
    word = "selected layers" if options.layers else "all layers"
    ax.set_title(f"Assignments dropped by the token capacity ({word})")
    ax.set_ylabel("dropped / selected assignments (%)")
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_ylim(bottom=0.0)
    step_axis(ax, runs)
    ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D
    handles = run_style_handles(tags) if len(runs) > 1 else []
    handles += layer_handles(runs[0], layers)
    handles += [Line2D([], [], color="black", lw=2.0, ls=style, label="all layers"
                       + (f", run {tag}" if len(runs) > 1 else ""))
                for _, tag, style in drawn]
    legend_outside(fig, None, handles, options.style)
    return fig


def plot_bias(plt, runs, tags, options=PlotOptions()):
    # Layers that route top-k in either run (outside top-k layers a run's bias stays 0).
    topk = np.nonzero(np.logical_or.reduce([topk_mask(run) for run in runs]))[0]
    layers = [l for l in topk if not options.layers or l in options.layers]
    if not layers:
        return None
    fig, axes = panel_grid(plt, len(layers), "Router bias per expert (top-k layers)",
                           style=options.style)
    colors = palette(runs[0].num_experts)
    for ax, layer in zip(axes, layers):
        for run, style in zip(runs, STYLES):
            bias = run.data["routing/bias"][:, layer, :]
            for e in range(run.num_experts):
                ax.plot(run.steps, bias[:, e], style, color=colors[e], lw=1.0)
        ax.set_title(f"layer {layer}", color=layer_color(layer, runs[0].num_layers))
        step_axis(ax, runs)
        ax.set_ylabel("bias (added to scores)")
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D
    handles = run_style_handles(tags) if len(runs) > 1 else []
    if len(colors) <= 16:
        handles += [Line2D([], [], color=color, label=f"expert {e}")
                    for e, color in enumerate(colors)]
    legend_outside(fig, None, handles, options.style)
    return fig


def rank_color(rank, num_ranks):
    """Ranks take a sequential map (their order means something), never a layer's colours; the
    two have legends of their own (plot_ranks)."""
    import matplotlib
    return matplotlib.colormaps["plasma"](0.85 * rank / max(num_ranks - 1, 1))


def plot_ranks(plt, runs, tags, options=PlotOptions()):
    """Assignments per rank (top panel, a line per rank) and the rank overload of each layer
    (bottom panel, a line per layer): two legends, one for each panel's lines."""
    look = options.style
    fig, (ax_load, ax_over) = plt.subplots(2, 1, figsize=look.figsize(6.5),
                                           layout="constrained")
    layers = drawn_layers(runs[0], options, balance_only=True)
    width = max(run.data["routing/rank_load"].shape[2] for run in runs)
    from matplotlib.lines import Line2D
    for run, tag, style in zip(runs, tags, STYLES):
        per_rank = run.data["routing/rank_load"].sum(axis=1)              # [N, W]
        for r in range(per_rank.shape[1]):
            ax_load.plot(run.steps, per_rank[:, r], style, color=rank_color(r, width), lw=1.0)
        plot_layer_lines(ax_over, run, rank_overload(run), style, tag, layers)
    ax_load.set_title("Assignments received per rank (all layers)")
    ax_load.set_ylabel("assignments per step")
    ax_over.set_title(f"Rank overload, most loaded rank ({layers_word(runs[0], options)})")
    ax_over.set_ylabel("max / mean rank load")
    for ax in (ax_load, ax_over):
        step_axis(ax, runs)
        ax.grid(alpha=0.3)
    runs_handles = run_style_handles(tags) if len(runs) > 1 else []
    rank_handles = ([Line2D([], [], color=rank_color(r, width), label=f"rank {r}")
                     for r in range(width)] if width <= 16 else [])
    # Each legend beside its panel: on screen right of it (ranks upper, layers lower), in the
    # paper style above the top panel (ranks) and below the bottom one (layers).
    if rank_handles:
        legend_outside(fig, None, runs_handles + rank_handles, look, second=look.paper,
                       title="ranks (top panel)")
        runs_handles = []
    legend_outside(fig, None, runs_handles + layer_handles(runs[0], layers)
                   + mean_handles(tags, layers), look,
                   second=bool(rank_handles) and not look.paper, title="layers (bottom panel)")
    return fig


def plot_loss(plt, runs, tags, options=PlotOptions()):
    fig, ax = plt.subplots(figsize=options.style.figsize(4.0), layout="constrained")
    for run, tag, style, color in zip(runs, tags, STYLES, palette(len(runs))):
        ax.plot(run.steps, run.data["steps/loss"], style, color=color, lw=1.5,
                label=f"{tag} loss")
    floor = entropy_floor(runs[0])
    if floor is not None:
        ax.axhline(floor, color="gray", ls=":", label=f"entropy floor {floor:.3f}")
    ax.set_title("Training loss (LM cross-entropy)")
    step_axis(ax, runs)
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    legend_outside(fig, [ax], style=options.style)
    return fig


def phase_colors(names):
    return dict(zip(names, palette(len(names))))


def plot_phases(plt, runs, tags, options=PlotOptions()):
    """Per run, the phases' time per step (mean over ranks, stacked, ms), and a bar chart of
    each phase's mean over the steps after the first."""
    runs_tags = [(run, tag) for run, tag in zip(runs, tags) if "perf/phase_time" in run.data]
    if not runs_tags:
        return None
    names = []
    for run, _ in runs_tags:
        names += [p for p in run.phases if p not in names]
    colors = phase_colors(names)
    panels = len(runs_tags) + 1
    if options.style.paper:          # one column: the panels one above the other
        fig, axes = plt.subplots(panels, 1, figsize=(options.style.width, 1.9 * panels),
                                 layout="constrained", squeeze=False)
    else:
        fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels + 1.6, 4.2),
                                 layout="constrained", squeeze=False)
    axes = axes.reshape(-1)
    bars = []
    for ax, (run, tag) in zip(axes, runs_tags):
        with np.errstate(invalid="ignore"):
            ms = 1e3 * np.nanmean(run.data["perf/phase_time"].astype(np.float64), axis=1)
        ms = np.nan_to_num(ms)                                             # [N, phases]
        ax.stackplot(run.steps, ms.T, colors=[colors[p] for p in run.phases],
                     labels=list(run.phases))
        ax.set_title(f"Phase time per step, run {tag}")
        ax.set_ylabel("time (ms, mean over ranks)")
        step_axis(ax, [run])
        ax.grid(alpha=0.3)
        later = ms[1:] if len(ms) > 1 else ms
        bars.append(dict(zip(run.phases, later.mean(axis=0))))
    ax = axes[-1]
    height = 0.8 / len(bars)
    y = np.arange(len(names))
    for i, (values, (_, tag)) in enumerate(zip(bars, runs_tags)):
        ax.barh(y + i * height, [values.get(p, 0.0) for p in names], height=height,
                color=[colors[p] for p in names], hatch=None if i == 0 else "//",
                edgecolor="white" if i == 0 else "0.3", label=f"run {tag}")
    ax.set_yticks(y + height * (len(bars) - 1) / 2, names)
    ax.invert_yaxis()
    ax.set_xlabel("mean time per step (ms), steps after the first")
    ax.set_ylabel("phase")
    ax.set_title("Mean phase time" + (" (hatched: run B)" if len(bars) > 1 else ""))
    ax.grid(alpha=0.3, axis="x")
    from matplotlib.patches import Patch
    legend_outside(fig, None, [Patch(color=colors[p], label=p) for p in names], options.style)
    return fig


def plot_shadows(plt, runs, tags, options=PlotOptions()):
    """The worst max violation over the top-k layers (those of --layers among them) at each step:
    a line per policy, the run's own (black, thick) and each shadow balancer; None when no run
    has shadows."""
    rules = list(dict.fromkeys(rule for run in runs for rule in shadow_rules(run)))
    layers = [l for l in np.nonzero(topk_mask(runs[0]))[0]
              if not options.layers or l in options.layers]
    if not rules or not layers:
        return None
    fig, ax = plt.subplots(figsize=options.style.figsize(4.2), layout="constrained")
    colors = {REAL: "black", **dict(zip(rules, palette(len(rules))))}
    for run, style in zip(runs, STYLES):
        if not shadow_rules(run):
            continue
        for label, values in policy_violations(run):
            ax.plot(run.steps, worst_over_layers(values, layers), style, color=colors[label],
                    lw=2.0 if label == REAL else 1.2)
    word = "selected top-k layers" if options.layers else "top-k layers"
    ax.set_title(f"Worst max violation over the {word}: the run's policy and its shadows")
    ax.set_ylabel("max violation (max − mean) / mean")
    step_axis(ax, runs)
    ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D
    handles = run_style_handles(tags) if len(runs) > 1 else []
    handles += [Line2D([], [], color=color, lw=2.0 if label == REAL else 1.2,
                       label=label if label == REAL else f"shadow {label}")
                for label, color in colors.items()]
    legend_outside(fig, None, handles, options.style)
    return fig


FIGURES = (("balance", plot_balance), ("metrics", plot_metrics), ("drop_rate", plot_drop_rate),
           ("bias", plot_bias),
           ("ranks", plot_ranks), ("loss", plot_loss), ("phases", plot_phases),
           ("shadows", plot_shadows))


def write_plots(runs, out_dir, dpi=80, save=save, options=None):
    """Writes every figure into out_dir, each saved (and closed) as soon as it is drawn, through
    save(plt, fig, out_dir, filename, dpi[, formats]); returns the paths written."""
    options = options or PlotOptions(dpi=dpi)
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise StatsError(f"{out_dir}: cannot create the output folder ({err.strerror})") from None
    if len(runs) > 1:
        check_same_shape(runs[0], runs[1])
    if options.steps:
        runs = [select_steps(run, *options.steps) for run in runs]
    if options.labels and len(options.labels) != len(runs):
        raise StatsError(f"--label given {len(options.labels)} times for {len(runs)} run(s)")
    plt = pyplot()
    tags = run_tags(runs, options.labels)
    paths = []
    keep = keeper(plt, out_dir, options, save, paths)
    with plt.rc_context(options.style.rc):
        for i, (run, tag) in enumerate(zip(runs, tags)):
            keep(plot_expert_load(plt, run, tag, options), f"expert_load_{'AB'[i]}")
        for name, draw in FIGURES:
            keep(draw(plt, runs, tags, options), name)
    return paths

#!/usr/bin/env python3
"""Post-hoc analysis of moe_rt statistics files (HDF5, format "moe_rt.stats", version 1).

    moe_stats.py summary RUN.h5
        configuration, steps, loss against the data's entropy floor, throughput, and the balance
        of each layer at a glance.
    moe_stats.py variance RUN_A.h5 [RUN_B.h5] [--steps S0,S1] [--markdown | --csv]
        the per-layer load-variance table of the seed document: variance at step S0 (run A), at
        step S1 in A and in B, improvement (A - B)/A, and a TOTAL row over the top-k layers.
    moe_stats.py plot RUN_A.h5 [RUN_B.h5] --out DIR
        PNG figures: expert-load heatmaps, variance and max violation, bias trajectories, per-rank
        load and overload, loss.

The file layout is documented in docs/analysis.md (SPEC §6). A file that is still being written is
opened for SWMR reading; only rows present in every per-step dataset count as complete. Errors are
one line on stderr and exit code 2. Importable: the tests call the functions and `main(argv)`.

Shapes: N complete rows (steps), L layers, E experts, W ranks.
"""
from __future__ import annotations

import argparse
import csv
import io
import math
import os
import sys
from dataclasses import dataclass

import h5py
import numpy as np

FORMAT_NAME = "moe_rt.stats"
FORMAT_VERSION = 1  # the newest version this script reads
PROG = "moe_stats.py"

# Per-step datasets: every one has N rows first; SPEC §6 requires the first group.
REQUIRED_PER_STEP = (
    "steps/step", "steps/loss", "steps/balance_loss", "steps/grad_norm", "steps/lr",
    "steps/tokens_per_s", "routing/expert_load", "routing/rank_load", "routing/bias",
    "routing/load_variance", "routing/max_violation",
)
OPTIONAL_PER_STEP = (
    "steps/step_time_s", "routing/load_cv", "routing/rank_overload", "routing/balance_loss",
    "perf/phase_time",
)
ROUTING_LABELS = {"hash": "Hash Routed", "topk": "Top-K Routed", "forced": "Forced"}
SUMMARY_CONFIG_KEYS = (
    "score-func", "route-scale", "bias-update-rate", "seq-aux-loss-weight", "force-balance",
    "lr", "warmup-steps", "grad-clip",
)
VARIANCE_REL_TOL = 1e-9  # stored /routing/load_variance against the recomputed one


class StatsError(Exception):
    """A problem with the input, reported as one line on stderr and exit code 2."""


@dataclass(frozen=True)
class Run:
    """Everything moe_stats reads from one statistics file, cut to its N complete rows."""

    path: str
    attrs: dict              # root attributes: strings decoded, numbers as Python scalars
    routing: tuple           # [L] "hash" | "topk" | "forced"
    data: dict               # "steps/loss" -> [N], "routing/expert_load" -> [N, L, E], ...
    phases: tuple = ()       # [num_phases] names of /perf/phase_time's last axis

    @property
    def steps(self):
        return self.data["steps/step"]

    @property
    def num_layers(self):
        return self.data["routing/expert_load"].shape[1]

    @property
    def num_experts(self):
        return self.data["routing/expert_load"].shape[2]

    @property
    def name(self):
        return os.path.basename(self.path)


# ---------------------------------------------------------------------------------------------
# Reading


def decode(value):
    """An HDF5 attribute or string element as a plain Python value (str, int, float or list)."""
    if isinstance(value, bytes):  # includes numpy.bytes_
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return decode(value.reshape(-1)[0])
        return [decode(v) for v in value.reshape(-1)]
    if isinstance(value, np.generic):
        return decode(value.item())
    return value


def open_stats_file(path):
    """h5py.File for reading, SWMR first so that a file being written can be read."""
    if not os.path.exists(path):
        raise StatsError(f"{path}: no such file")
    if os.path.isdir(path):
        raise StatsError(f"{path}: is a directory, not a statistics file")
    try:
        is_hdf5 = h5py.is_hdf5(path)
    except OSError as err:
        raise StatsError(f"{path}: cannot read ({err})") from None
    if not is_hdf5:
        raise StatsError(f"{path}: not an HDF5 file")
    try:
        return h5py.File(path, "r", libver="latest", swmr=True)
    except (OSError, ValueError):
        pass  # written without SWMR support (or by an older library): a plain open reads it
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise StatsError(f"{path}: cannot open as HDF5 ({str(err).splitlines()[0]})") from None


def check_format(path, attrs):
    fmt = attrs.get("format")
    if fmt is None:
        raise StatsError(f"{path}: not a moe_rt statistics file (no 'format' attribute)")
    if fmt != FORMAT_NAME:
        raise StatsError(f"{path}: not a moe_rt statistics file "
                         f"(format is {fmt!r}, expected {FORMAT_NAME!r})")
    version = attrs.get("format_version")
    if not isinstance(version, (int, float)) or isinstance(version, bool):
        raise StatsError(f"{path}: no integer 'format_version' attribute "
                         f"(this script reads version {FORMAT_VERSION})")
    if version > FORMAT_VERSION:
        raise StatsError(f"{path}: format_version {version} is newer than this moe_stats.py "
                         f"supports (version {FORMAT_VERSION}); use the moe_stats.py of the "
                         f"moe_rt that wrote the file")
    if version < 1:
        raise StatsError(f"{path}: unknown format_version {version} "
                         f"(this script reads version {FORMAT_VERSION})")


def complete_rows(path, f, names):
    """N: the number of rows present in every per-step dataset (a writer appends one by one),
    less trailing rows whose /steps/step still holds the fill value -1 (not yet written)."""
    lengths = []
    for name in names:
        if f[name].ndim == 0:
            raise StatsError(f"{path}: /{name} is a scalar, expected one row per step")
        lengths.append(f[name].shape[0])
    n = min(lengths)
    steps = f["steps/step"][:n]
    while n > 0 and steps[n - 1] < 0:
        n -= 1
    if n == 0:
        raise StatsError(f"{path}: empty statistics file (no complete steps yet)")
    return n


def read_per_step(path, f):
    for name in REQUIRED_PER_STEP:
        if name not in f:
            raise StatsError(f"{path}: missing dataset /{name} "
                             f"(required by format_version {FORMAT_VERSION})")
    names = list(REQUIRED_PER_STEP) + [n for n in OPTIONAL_PER_STEP if n in f]
    n = complete_rows(path, f, names)
    return {name: f[name][:n] for name in names}


def read_strings(f, name):
    if name not in f or f[name].size == 0:
        return ()
    return tuple(decode(v) for v in f[name][()].reshape(-1))


def load_run(path):
    """Reads and checks one statistics file; raises StatsError naming the file."""
    with open_stats_file(path) as f:
        attrs = {key: decode(value) for key, value in f.attrs.items()}
        check_format(path, attrs)
        if "layers/routing" not in f:
            raise StatsError(f"{path}: missing dataset /layers/routing")
        routing = read_strings(f, "layers/routing")
        data = read_per_step(path, f)
        phases = read_strings(f, "perf/phases")
    run = Run(path=path, attrs=attrs, routing=routing, data=data, phases=phases)
    if len(routing) != run.num_layers:
        raise StatsError(f"{path}: /layers/routing has {len(routing)} layers but "
                         f"/routing/expert_load has {run.num_layers}")
    return run


def parse_config_text(text):
    """The `key = value` lines of the config attribute as a dict (comments skipped)."""
    config = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        config[key.strip()] = value.strip()
    return config


def entropy_floor(run):
    """The data's entropy floor in nats per token, or None when unknown (NaN or absent)."""
    value = run.attrs.get("entropy_floor")
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def row_of_step(run, step):
    """The row index holding step `step` (a /steps/step value, not a row index)."""
    rows = np.nonzero(run.steps == step)[0]
    if rows.size == 0:
        raise StatsError(f"{run.path}: step {step} is not in the file (it holds steps "
                         f"{int(run.steps[0])}..{int(run.steps[-1])}, {len(run.steps)} rows)")
    return int(rows[0])


def routing_label(kind):
    return ROUTING_LABELS.get(kind, kind)


def topk_mask(run):
    """[L] bool: the top-k layers, the only ones the bias and the balance loss act on."""
    return np.array([kind == "topk" for kind in run.routing], dtype=bool)


def balance_layers(run):
    """Layers whose balance the plots follow: the top-k layers, or all when there are none."""
    mask = topk_mask(run)
    return np.nonzero(mask)[0] if mask.any() else np.arange(run.num_layers)


def rank_overload(run):
    """[N, L] overload of the most loaded rank: the stored dataset, else max/mean of rank_load."""
    if "routing/rank_overload" in run.data:
        return run.data["routing/rank_overload"]
    load = run.data["routing/rank_load"].astype(np.float64)
    mean = load.mean(axis=2)
    return np.divide(load.max(axis=2), mean, out=np.ones_like(mean), where=mean > 0)


# ---------------------------------------------------------------------------------------------
# Variance table


@dataclass(frozen=True)
class VarianceRow:
    label: str       # layer index, or "TOTAL/AVG"
    routing: str     # "Hash Routed", "Top-K Routed", "Forced", or "Top-K Only"
    values: tuple    # the variance columns
    change: object   # fraction, or None for n/a


@dataclass(frozen=True)
class VarianceTable:
    title: str
    headers: tuple
    rows: tuple      # one VarianceRow per layer
    total: VarianceRow
    signed: bool     # one run: the change column is a signed relative change


def layer_variances(run, row):
    """[L] population variance of the expert load over experts at one row (numpy var, ddof=0)."""
    return np.var(run.data["routing/expert_load"][row].astype(np.float64), axis=1)


def improvement(a, b):
    """(a - b)/a; 0 when both are 0; None (n/a) when only a is 0."""
    if a == 0:
        return 0.0 if b == 0 else None
    return float((a - b) / a)


def relative_change(old, new):
    """(new - old)/old with improvement's zero rules: a fall in variance is negative."""
    if old == 0:
        return 0.0 if new == 0 else None
    return float((new - old) / old)


def variance_mismatches(run, rows):
    """Warnings where /routing/load_variance differs from the recomputed variance."""
    messages = []
    for row in rows:
        stored = run.data["routing/load_variance"][row]
        computed = layer_variances(run, row)
        scale = np.maximum(np.abs(stored), np.abs(computed))
        bad = ~(np.abs(stored - computed) <= VARIANCE_REL_TOL * scale)   # NaN counts as bad
        for layer in np.nonzero(bad)[0]:
            messages.append(f"{run.path}: /routing/load_variance at step {int(run.steps[row])} "
                            f"layer {layer} is {stored[layer]!r} but the variance of "
                            f"/routing/expert_load is {computed[layer]!r}; using the latter")
    return messages


def check_same_shape(run_a, run_b):
    if (run_a.num_layers, run_a.num_experts) != (run_b.num_layers, run_b.num_experts):
        raise StatsError(f"{run_b.path}: {run_b.num_layers} layers x {run_b.num_experts} experts, "
                         f"but {run_a.path} has {run_a.num_layers} x {run_a.num_experts}; "
                         f"runs compared in one table must have the same shape")


def routing_mismatches(run_a, run_b):
    if run_a.routing == run_b.routing:
        return []
    return [f"{run_b.path}: layer routing {list(run_b.routing)} differs from {run_a.path} "
            f"{list(run_a.routing)}; the table labels and TOTAL follow run A"]


def variance_headers(step0, step1, two_runs):
    if two_runs:
        return ("Layer Index", "Routing Type", f"Step {step0} Var (Baseline)",
                f"Step {step1} Var (Run A)", f"Step {step1} Var (Run B)", "Improvement (A vs B)")
    return ("Layer Index", "Routing Type", f"Step {step0} Var (Baseline)", f"Step {step1} Var",
            f"Change (Step {step0} to {step1})")


def variance_table(run_a, run_b, step0, step1):
    """The seed's table. Two runs: change = improvement (A - B)/A at step1. One run: change =
    (var at step1 - var at step0)/var at step0, so a fall in variance is negative."""
    columns = [layer_variances(run_a, row_of_step(run_a, step0)),
               layer_variances(run_a, row_of_step(run_a, step1))]
    if run_b is not None:
        check_same_shape(run_a, run_b)
        columns.append(layer_variances(run_b, row_of_step(run_b, step1)))
        change = improvement
    else:
        change = relative_change
    rows = tuple(VarianceRow(str(layer), routing_label(run_a.routing[layer]),
                             tuple(float(c[layer]) for c in columns),
                             change(columns[-2][layer], columns[-1][layer]))
                 for layer in range(run_a.num_layers))
    mask = topk_mask(run_a)
    sums = tuple(float(c[mask].sum()) for c in columns)
    total = VarianceRow("TOTAL/AVG", "Top-K Only", sums, change(sums[-2], sums[-1]))
    title = (f"=== {run_a.attrs.get('model', 'moe_rt')} Load Balancing Variance Analysis "
             f"(Step {step0} vs Step {step1}) ===")
    return VarianceTable(title, variance_headers(step0, step1, run_b is not None), rows, total,
                         signed=run_b is None)


def format_percent(change, signed=False):
    if change is None:
        return "n/a"
    return f"{100.0 * change:+.2f}%" if signed and change != 0 else f"{100.0 * change:.2f}%"


def row_cells(row, signed):
    return [row.label, row.routing] + [f"{v:.2f}" for v in row.values] + [
        format_percent(row.change, signed)]


def pad_rows(rows, aligns):
    """Pads every cell to its column's width; aligns[i][j] is '<' or '>' for row i, column j."""
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    return [[cell.rjust(w) if a == ">" else cell.ljust(w) for cell, a, w in zip(r, al, widths)]
            for r, al in zip(rows, aligns)]


def table_grid(table):
    """Header, layer rows and TOTAL as padded string cells, and the column widths."""
    body = [row_cells(r, table.signed) for r in table.rows]
    total = row_cells(table.total, table.signed)
    ncols = len(table.headers)
    aligns = ([["<"] * ncols] + [[">", "<"] + [">"] * (ncols - 2)] * len(body)
              + [["<", "<"] + [">"] * (ncols - 2)])
    grid = pad_rows([list(table.headers)] + body + [total], aligns)
    return grid[0], grid[1:-1], grid[-1], [len(c) for c in grid[0]]


def render_text(table):
    header, body, total, widths = table_grid(table)
    lines = [table.title, "", "  ".join(header).rstrip()]
    lines += ["  ".join(r).rstrip() for r in body]
    lines += ["  ".join("-" * w for w in widths), "  ".join(total).rstrip()]
    return "\n".join(lines) + "\n"


def markdown_line(cells):
    return "| " + " | ".join(cells) + " |"


def render_markdown(table):
    header, body, total, widths = table_grid(table)
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    lines = [table.title, "", markdown_line(header), rule]
    lines += [markdown_line(r) for r in body] + [rule, markdown_line(total)]
    return "\n".join(lines) + "\n"


def render_csv(table):
    """Full-precision numbers; the change column is a percentage without the % sign."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.headers)
    for row in list(table.rows) + [table.total]:
        change = "n/a" if row.change is None else repr(100.0 * row.change)
        writer.writerow([row.label, row.routing] + [repr(v) for v in row.values] + [change])
    return out.getvalue()


def parse_steps(text):
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
        raise StatsError(f"--steps {text!r}: expected two step numbers, e.g. --steps 0,20")
    return int(parts[0]), int(parts[1])


def default_steps(runs):
    """Run A's first step and the last step present in every run."""
    return int(runs[0].steps[0]), int(min(run.steps[-1] for run in runs))


# ---------------------------------------------------------------------------------------------
# Summary


def summary_config_lines(run):
    a = run.attrs
    config = parse_config_text(a.get("config", ""))
    mask = topk_mask(run)
    num_hash = sum(kind == "hash" for kind in run.routing)
    picked = ", ".join(f"{k} = {config[k]}" for k in SUMMARY_CONFIG_KEYS if k in config)
    return [
        ("file", f"{run.path} ({a.get('format')} v{a.get('format_version')}, "
                 f"{a.get('program_version', '?')}, created {a.get('created', '?')})"),
        ("model", f"{a.get('model', '?')}"),
        ("ranks", f"{a.get('world_size', '?')} (EP group {a.get('ep_size', '?')})"),
        ("seed", f"{a.get('seed', '?')}"),
        ("data", f"{a.get('data', '?')}"),
        ("shape", f"{run.num_layers} layers ({num_hash} hash, {int(mask.sum())} top-k), "
                  f"{run.num_experts} experts, top-k {a.get('top_k', '?')}, vocab "
                  f"{a.get('vocab', '?')}, seq-len {a.get('seq_len', '?')}, batch-per-rank "
                  f"{a.get('batch_per_rank', '?')}"),
        ("config", picked or "(no config text)"),
    ]


def summary_progress_lines(run):
    loss = run.data["steps/loss"]
    steps = run.steps
    best = int(np.nanargmin(loss)) if np.isfinite(loss).any() else 0
    loss_text = (f"first {loss[0]:.4f}, last {loss[-1]:.4f}, "
                 f"min {loss[best]:.4f} at step {int(steps[best])}")
    floor = entropy_floor(run)
    loss_text += ("; entropy floor unknown" if floor is None else
                  f"; entropy floor {floor:.4f} nats (last is {loss[-1] - floor:.4f} above)")
    tps = run.data["steps/tokens_per_s"]
    median = float(np.median(tps[1:] if len(tps) > 1 else tps))
    return [
        ("steps", f"{len(steps)} (step {int(steps[0])} .. {int(steps[-1])})"),
        ("loss", loss_text),
        ("tokens/s", f"{median:.0f} (median over steps after the first)"),
    ]


def summary_layer_rows(run):
    var = run.data["routing/load_variance"]
    viol = run.data["routing/max_violation"]
    over = rank_overload(run)
    rows = [["layer", "routing", "mean var", "last var", "last max viol", "last rank overload"]]
    for layer in range(run.num_layers):
        rows.append([str(layer), routing_label(run.routing[layer]), f"{var[:, layer].mean():.2f}",
                     f"{var[-1, layer]:.2f}", f"{viol[-1, layer]:.3f}", f"{over[-1, layer]:.3f}"])
    aligns = [["<"] * 6] + [[">", "<", ">", ">", ">", ">"]] * run.num_layers
    return pad_rows(rows, aligns)


def render_summary(run):
    pairs = summary_config_lines(run) + summary_progress_lines(run)
    width = max(len(key) for key, _ in pairs)
    lines = [f"{key.ljust(width)}  {value}" for key, value in pairs]
    lines += ["", "per-layer balance (variance of the expert load; violation (max - mean)/mean; "
                  "rank overload as stored)"]
    lines += ["  ".join(r).rstrip() for r in summary_layer_rows(run)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Plots


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


def step_axis(ax):
    from matplotlib.ticker import MaxNLocator
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save(plt, fig, out_dir, filename, dpi):
    path = os.path.join(out_dir, filename)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_expert_load(plt, run, tag, out_dir, filename, dpi):
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
        step_axis(ax)
        ax.set_ylabel("expert")
    fig.colorbar(image, ax=list(axes[:run.num_layers]), label="load / mean load (1 = balanced)")
    return save(plt, fig, out_dir, filename, dpi)


def plot_layer_lines(ax, run, values, style, tag, label_layers):
    """values [N, L]: thin lines for the balance layers, a thick line for their mean."""
    layers = balance_layers(run)
    for i, layer in enumerate(layers):
        label = f"{tag} layer {layer}" if label_layers else None
        ax.plot(run.steps, values[:, layer], style, color=f"C{i % 10}", lw=0.9, alpha=0.8,
                label=label)
    ax.plot(run.steps, values[:, layers].mean(axis=1), style, color="black", lw=2.0,
            label=f"{tag} mean over layers")


def plot_balance(plt, runs, tags, out_dir, dpi):
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
        step_axis(ax)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    return save(plt, fig, out_dir, "balance.png", dpi)


def plot_bias(plt, runs, tags, out_dir, dpi):
    layers = np.nonzero(topk_mask(runs[0]))[0]
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
        step_axis(ax)
        ax.set_ylabel("bias")
        ax.grid(alpha=0.3)
    # One legend for the figure: colour = expert, line style = run (readable at any size).
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], color="0.3", ls=style, label=tag) for tag, style in zip(tags, styles)]
    if runs[0].num_experts <= 16:
        handles += [Line2D([], [], color=f"C{e % 10}", label=f"expert {e}")
                    for e in range(runs[0].num_experts)]
    axes[0].legend(handles=handles, fontsize=7, ncol=2, loc="best")
    return save(plt, fig, out_dir, "bias.png", dpi)


def plot_ranks(plt, runs, tags, out_dir, dpi):
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
        step_axis(ax)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
    return save(plt, fig, out_dir, "ranks.png", dpi)


def plot_loss(plt, runs, tags, out_dir, dpi):
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    for run, tag, style in zip(runs, tags, ["-", "--"]):
        ax.plot(run.steps, run.data["steps/loss"], style, lw=1.5, label=f"{tag} loss")
    floor = entropy_floor(runs[0])
    if floor is not None:
        ax.axhline(floor, color="gray", ls=":", label=f"entropy floor {floor:.3f}")
    ax.set_title("Training loss (LM cross-entropy)")
    step_axis(ax)
    ax.set_ylabel("loss (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    return save(plt, fig, out_dir, "loss.png", dpi)


def write_plots(runs, out_dir, dpi=80):
    """Writes every figure into out_dir; returns the paths written."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise StatsError(f"{out_dir}: cannot create the output folder ({err.strerror})") from None
    if len(runs) > 1:
        check_same_shape(runs[0], runs[1])
    plt = pyplot()
    tags = run_tags(runs)
    paths = [plot_expert_load(plt, run, tag, out_dir, f"expert_load_{'AB'[i]}.png", dpi)
             for i, (run, tag) in enumerate(zip(runs, tags))]
    paths += [plot_balance(plt, runs, tags, out_dir, dpi),
              plot_bias(plt, runs, tags, out_dir, dpi),
              plot_ranks(plt, runs, tags, out_dir, dpi),
              plot_loss(plt, runs, tags, out_dir, dpi)]
    return [p for p in paths if p is not None]


# ---------------------------------------------------------------------------------------------
# Command line


def build_parser():
    usage_block = __doc__.split("\n\nThe file layout")[0]
    parser = argparse.ArgumentParser(prog=PROG, description=usage_block,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Errors: one line on stderr, exit code 2.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summary", help="configuration, loss, throughput, per-layer balance")
    p.add_argument("run", help="statistics file (HDF5)")
    p = sub.add_parser("variance", help="the per-layer load-variance table (seed document)")
    p.add_argument("run_a", help="run A (also the step-0 baseline)")
    p.add_argument("run_b", nargs="?", help="run B, compared with A at the second step")
    p.add_argument("--steps", metavar="S0,S1",
                   help="two /steps/step values (default: run A's first step and the last "
                        "step present in every run)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="markdown table")
    fmt.add_argument("--csv", action="store_true", help="CSV, full precision, %% without sign")
    p = sub.add_parser("plot", help="PNG figures")
    p.add_argument("run_a", help="run A (solid lines)")
    p.add_argument("run_b", nargs="?", help="run B (dashed lines)")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--dpi", type=int, default=80, help="resolution of the PNG files")
    return parser


def warn(messages, stream):
    for message in messages:
        print(f"{PROG}: warning: {message}", file=stream)


def command_summary(args, out, err):
    out.write(render_summary(load_run(args.run)))


def command_variance(args, out, err):
    runs = [load_run(args.run_a)] + ([load_run(args.run_b)] if args.run_b else [])
    step0, step1 = parse_steps(args.steps) if args.steps else default_steps(runs)
    table = variance_table(runs[0], runs[1] if len(runs) > 1 else None, step0, step1)
    warn(variance_mismatches(runs[0], [row_of_step(runs[0], step0), row_of_step(runs[0], step1)]),
         err)
    if len(runs) > 1:
        warn(variance_mismatches(runs[1], [row_of_step(runs[1], step1)]), err)
        warn(routing_mismatches(runs[0], runs[1]), err)
    render = render_csv if args.csv else render_markdown if args.markdown else render_text
    out.write(render(table))


def command_plot(args, out, err):
    runs = [load_run(args.run_a)] + ([load_run(args.run_b)] if args.run_b else [])
    for path in write_plots(runs, args.out, args.dpi):
        out.write(path + "\n")


def main(argv=None, out=None, err=None):
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    commands = {"summary": command_summary, "variance": command_variance, "plot": command_plot}
    try:
        commands[args.command](args, out, err)
    except StatsError as error:
        print(f"{PROG}: error: {error}", file=err)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

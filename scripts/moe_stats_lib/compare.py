"""`moe_stats.py compare`: two or more runs side by side, in one table (a column per run) and the
figures of compare_figures.py.

The table's rows, for each run (a resumed run read whole, as every command reads it):
    last step                    the run's last step
    loss                         /steps/loss at the last step, or its mean over the last W steps
                                 (--window W; all of them where the run has fewer)
    validation loss              /eval/loss of the run's last validation row, and the step it
                                 followed; rows present when some run has validation rows
    max violation, layer l       (max - mean) / mean of the expert load (metrics.py "violation",
                                 recomputed from /routing/expert_load) in layer l, as the loss:
                                 last step or mean over the window; the layers: --layers, else
                                 those top-k in any run (all when none is)
    worst max violation          the largest of those
    drop rate                    assignments dropped by the token capacity / selected, all layers,
                                 at the last step or summed over the window (metrics.py
                                 drop_fraction); '-' for a run without a capacity (capacity_on),
                                 'n/a' for one with a capacity whose file counts no drops
Runs must have the same number of layers and experts (check_same_shape).

Shapes: N complete rows (steps), L layers, E experts.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass

import numpy as np

from .figure_style import short_labels
from .metrics import capacity_on, drop_fraction, layer_metrics
from .stats_file import StatsError, check_same_shape, topk_mask
from .variance import markdown_line, pad_rows

NONE = "-"    # a run that has no such value
UNCOUNTED = "n/a"


@dataclass(frozen=True)
class CompareRow:
    name: str
    kind: str        # "step", "loss", "violation", "rate": how its values are written
    values: tuple    # one per run: a number, NONE or UNCOUNTED


@dataclass(frozen=True)
class CompareTable:
    title: str
    labels: tuple    # one per run
    runs: tuple      # (label, path, files, first step, last step) per run
    rows: tuple
    window: int


def run_labels(runs, labels=()):
    """--label NAME once per run, or the short labels of their files; StatsError when the count
    is wrong or a name repeats."""
    if not labels:
        return short_labels([run.path for run in runs])
    if len(labels) != len(runs):
        raise StatsError(f"--label given {len(labels)} times for {len(runs)} runs (once per run, "
                         f"in order)")
    repeated = [label for i, label in enumerate(labels) if label in labels[:i]]
    if repeated:
        raise StatsError(f"--label '{repeated[0]}' names two runs; each run needs its own")
    return list(labels)


def check_comparable(runs):
    """Two or more runs of one model shape."""
    if len(runs) < 2:
        raise StatsError(f"compare needs 2 or more runs, got {len(runs)}")
    for run in runs[1:]:
        check_same_shape(runs[0], run)


def routing_mismatches(runs):
    return [f"{run.path}: layer routing {list(run.routing)} differs from {runs[0].path} "
            f"{list(runs[0].routing)}; the violation rows take the layers top-k in any run"
            for run in runs[1:] if run.routing != runs[0].routing]


def compared_layers(runs, layers=()):
    """--layers (checked against L), else the layers top-k in any run, or all when none is."""
    count = runs[0].num_layers
    if layers:
        bad = [l for l in layers if not 0 <= l < count]
        if bad:
            raise StatsError(f"--layers: the runs have layers 0..{count - 1}, not {bad[0]}")
        return list(layers)
    topk = np.logical_or.reduce([topk_mask(run) for run in runs])
    return [int(l) for l in np.nonzero(topk)[0]] if topk.any() else list(range(count))


def window_rows(run, window):
    """The rows of the run's last `window` steps (all of them where it has fewer)."""
    return slice(max(0, len(run.steps) - window), len(run.steps))


def final_violations(run, layers, window):
    """[len(layers)]: each layer's max violation at the last step, or its mean over the window."""
    violation = layer_metrics(run)["violation"][window_rows(run, window)]     # [w, L]
    return violation[:, layers].mean(axis=0)


def final_drop_rate(run, window):
    if not capacity_on(run):
        return NONE
    dropped = run.data.get("routing/dropped")
    if dropped is None:
        return UNCOUNTED
    rows = window_rows(run, window)
    return drop_fraction(dropped[rows], run.data["routing/expert_load"][rows])


def has_validation(run):
    """Whether the run holds at least one evaluation (a file with /eval but no row yet: no)."""
    return bool(run.eval) and len(run.eval["eval/step"]) > 0


def compare_table(runs, labels, layers, window=1):
    """The table of the runs (checked by check_comparable), a column per run."""
    rows = [CompareRow("last step", "step", tuple(int(run.steps[-1]) for run in runs)),
            CompareRow("loss", "loss", tuple(
                float(np.mean(run.data["steps/loss"][window_rows(run, window)]))
                for run in runs))]
    has_eval = [has_validation(run) for run in runs]
    if any(has_eval):
        rows.append(CompareRow("validation loss", "loss", tuple(
            float(run.eval["eval/loss"][-1]) if has else NONE
            for run, has in zip(runs, has_eval))))
        rows.append(CompareRow("validation after step", "step", tuple(
            int(run.eval["eval/step"][-1]) if has else NONE
            for run, has in zip(runs, has_eval))))
    violations = [final_violations(run, layers, window) for run in runs]
    for i, layer in enumerate(layers):
        rows.append(CompareRow(f"max violation, layer {layer}", "violation",
                               tuple(float(v[i]) for v in violations)))
    if len(layers) > 1:
        rows.append(CompareRow(f"worst max violation ({layers_phrase(runs, layers)})",
                               "violation", tuple(float(v.max()) for v in violations)))
    rows.append(CompareRow("drop rate", "rate",
                           tuple(final_drop_rate(run, window) for run in runs)))
    when = "last step" if window == 1 else f"mean over the last {window} steps"
    title = f"=== {len(runs)} runs compared ({when} of each run) ==="
    described = tuple((label, run.path, len(run.segments) or 1, int(run.steps[0]),
                       int(run.steps[-1])) for label, run in zip(labels, runs))
    return CompareTable(title, tuple(labels), described, tuple(rows), window)


def layers_phrase(runs, layers):
    topk = np.logical_or.reduce([topk_mask(run) for run in runs])
    if list(layers) == [int(l) for l in np.nonzero(topk)[0]]:
        return "top-k layers"
    return "layers " + ",".join(str(l) for l in layers)


def cell(value, kind):
    if isinstance(value, str):
        return value
    if kind == "step":
        return str(value)
    if kind == "loss":
        return f"{value:.4f}"
    if kind == "violation":
        return f"{value:.3f}"
    return f"{100.0 * value:.2f}%"


def table_cells(table):
    """Header and rows as padded string cells."""
    rows = [["", *table.labels]] + [[row.name] + [cell(v, row.kind) for v in row.values]
                                    for row in table.rows]
    aligns = [["<"] + [">"] * len(table.labels)] * len(rows)
    return pad_rows(rows, aligns)


def run_lines(table):
    lines = []
    for label, path, files, first, last in table.runs:
        chain = f", {files} files" if files > 1 else ""
        lines.append(f"{label}: {path} (steps {first}..{last}{chain})")
    return lines


def note(table):
    if table.window == 1:
        return "loss, max violation and drop rate at each run's last step"
    return (f"loss and max violation: the mean over each run's last {table.window} steps; drop "
            f"rate: dropped / selected summed over the same steps")


def render_text(table):
    grid = table_cells(table)
    widths = [len(c) for c in grid[0]]
    lines = [table.title, "", "  ".join(grid[0]).rstrip(), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(r).rstrip() for r in grid[1:]]
    lines += ["", note(table) + "; '-': the run has none"] + run_lines(table)
    return "\n".join(lines) + "\n"


def render_markdown(table):
    grid = table_cells(table)
    widths = [len(c) for c in grid[0]]
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    lines = [table.title, "", markdown_line(grid[0]), rule]
    lines += [markdown_line(r) for r in grid[1:]]
    lines += ["", note(table) + "; '-': the run has none", ""]
    lines += [f"- {line}" for line in run_lines(table)]
    return "\n".join(lines) + "\n"


def render_csv(table):
    """A row per quantity, a column per run; full precision, the drop rate in % without the
    sign, an empty cell where the run has none (or, for the drop rate, counts none)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["quantity", *table.labels])
    for row in table.rows:
        writer.writerow([row.name] + [
            "" if isinstance(v, str) else str(v) if row.kind == "step"
            else repr(100.0 * v) if row.kind == "rate" else repr(v) for v in row.values])
    return out.getvalue()

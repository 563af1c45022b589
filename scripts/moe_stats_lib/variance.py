"""The per-layer load-variance table (docs/load-balancing.md): its values from one or two runs,
the checks of the stored variance against the recomputed one, the choice of the two steps, and its
text, markdown and CSV forms.

Shapes: N complete rows (steps), L layers, E experts.
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

import numpy as np

from .stats_file import StatsError, check_same_shape, routing_label, row_of_step, topk_mask

VARIANCE_REL_TOL = 1e-9  # stored /routing/load_variance against the recomputed one


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


def all_layer_variances(run):
    """[N, L] layer_variances at every row."""
    return np.var(run.data["routing/expert_load"].astype(np.float64), axis=2)


def disagrees(stored, computed):
    """Where a stored variance is not the recomputed one within VARIANCE_REL_TOL (NaN counts)."""
    scale = np.maximum(np.abs(stored), np.abs(computed))
    return ~(np.abs(stored - computed) <= VARIANCE_REL_TOL * scale)


def stored_variance_warning(run):
    """One warning when /routing/load_variance differs anywhere from the recomputed variance
    (the summary reads every row; the table warns row by row instead)."""
    stored = run.data["routing/load_variance"]
    computed = all_layer_variances(run)
    bad = disagrees(stored, computed)
    if not bad.any():
        return []
    row, layer = (int(i) for i in np.argwhere(bad)[0])
    where = f" in {run.file_of_row(row)}" if run.is_chain else ""
    return [f"{run.path}: /routing/load_variance differs from the variance of "
            f"/routing/expert_load in {int(bad.sum())} of {bad.size} values (first at step "
            f"{int(run.steps[row])} layer {layer}{where}: {float(stored[row, layer])!r} against "
            f"{float(computed[row, layer])!r}); using the latter"]


def variance_mismatches(run, rows):
    """Warnings where /routing/load_variance differs from the recomputed variance, each naming
    the file that holds the row (of a resumed run, not always the newest)."""
    messages = []
    for row in rows:
        stored = run.data["routing/load_variance"][row]
        computed = layer_variances(run, row)
        for layer in np.nonzero(disagrees(stored, computed))[0]:
            messages.append(f"{run.file_of_row(row)}: /routing/load_variance at step "
                            f"{int(run.steps[row])} layer {layer} is {float(stored[layer])!r} but the variance of "
                            f"/routing/expert_load is {float(computed[layer])!r}; using the "
                            f"latter")
    return messages


def routing_mismatches(run_a, run_b):
    if run_a.routing == run_b.routing:
        return []
    return [f"{run_b.path}: layer routing {list(run_b.routing)} differs from {run_a.path} "
            f"{list(run_a.routing)}; the labels follow run A, TOTAL takes the layers top-k in "
            f"both"]


def variance_headers(step0, step1, two_runs):
    if two_runs:
        return ("Layer Index", "Routing Type", f"Step {step0} Var (Baseline)",
                f"Step {step1} Var (Run A)", f"Step {step1} Var (Run B)", "Improvement (A vs B)")
    return ("Layer Index", "Routing Type", f"Step {step0} Var (Baseline)", f"Step {step1} Var",
            f"Change (Step {step0} to {step1})")


def variance_table(run_a, run_b, step0, step1):
    """The load-variance table. Two runs: change = improvement (A - B)/A at step1. One run: change =
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
    # Layers that route top-k in every run compared: a layer that is hash-routed in either run
    # is not the bias's to balance.
    mask = topk_mask(run_a) & (topk_mask(run_b) if run_b is not None else True)
    sums = tuple(float(c[mask].sum()) for c in columns)
    # Without top-k layers there is nothing to total: n/a, not a 0.00% that reads as no change.
    total = VarianceRow("TOTAL/AVG", "Top-K Only", sums,
                        change(sums[-2], sums[-1]) if mask.any() else None)
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


STEP_PATTERN = re.compile(r"-?[0-9]+")  # ASCII digits only: str.isdigit() also takes "²"


def parse_steps(text):
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(STEP_PATTERN.fullmatch(p) for p in parts):
        raise StatsError(f"--steps {text!r}: expected two step numbers, e.g. --steps 0,20")
    return int(parts[0]), int(parts[1])


def default_steps(runs):
    """Run A's first step and the last step present in every run."""
    return int(runs[0].steps[0]), int(min(run.steps[-1] for run in runs))

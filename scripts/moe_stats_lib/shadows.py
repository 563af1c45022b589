"""`moe_stats.py shadows`: the shadow balancers of a run with `moe_rt --shadow RULE[,RULE...]`
against the run's own policy, as the max violation (max - mean)/mean of the expert load of each
top-k layer: the worst over the steps, the mean over the late steps (the last quarter) and the
final step's; `summary`, `plot`, `export` and `tensorboard` take their shadow numbers from here.

A shadow routes the same router scores as the run, every step, with its own bias (its own
top-k), counts the loads it would have produced (/shadow/RULE/expert_load, max_violation) and
updates its bias by its rule; nothing it does changes training. It sees the router trained under
the real policy, not under its own: it tells how its rule would have balanced these scores, not
how a model trained with it would have evolved. A shadow routes the top-k layers only (its loads
are 0 in hash and forced layers), so those are left out.

Shapes: N complete rows (steps), L layers.
"""
from __future__ import annotations

import math

import numpy as np

from .stats_file import StatsError, shadow_rules, topk_mask
from .variance import pad_rows

REAL = "real (the run's own)"   # the run's own policy, /routing/max_violation
LATE_FRACTION = 4               # the late window: the last quarter of the steps (at least one)


def require_shadows(run):
    """The run's shadow rules; StatsError (exit code 2) for a run without /shadow."""
    rules = shadow_rules(run)
    if rules:
        return rules
    chain = (f"; or not every one of the {len(run.segments)} files of this resumed run has "
             f"them (--no-chain reads the named file alone)" if run.is_chain else "")
    raise StatsError(f"{run.path}: no shadow balancers (no /shadow group: moe_rt writes it with "
                     f"--shadow RULE[,RULE...]){chain}")


def shadow_layers(run):
    """[L_topk] indices of the top-k layers, the only ones a shadow routes; StatsError without."""
    layers = np.nonzero(topk_mask(run))[0]
    if layers.size == 0:
        raise StatsError(f"{run.path}: no top-k layer (/layers/routing); shadow balancers route "
                         f"only top-k layers")
    return layers


def policy_violations(run):
    """[(label, [N, L] float64)] max violation of the run's own policy (REAL), then of each
    shadow rule."""
    return [(REAL, np.asarray(run.data["routing/max_violation"], dtype=np.float64))] + [
        (rule, np.asarray(run.data[f"shadow/{rule}/max_violation"], dtype=np.float64))
        for rule in shadow_rules(run)]


def worst_over_layers(values, layers):
    """[N]: at each step, the largest of values [N, L] over `layers`."""
    return values[:, layers].max(axis=1)


def late_rows(num_rows):
    """Rows in the late window: the last quarter of num_rows, at least one."""
    return max(1, math.ceil(num_rows / LATE_FRACTION))


def series_summary(series, late):
    """(worst, row of the worst, mean of the last `late` rows, final) of one series [N]."""
    row = int(np.argmax(series))
    return float(series[row]), row, float(series[-late:].mean()), float(series[-1])


def shadow_table(run):
    """[(layer, label, worst, step of the worst, late mean, final)]: per top-k layer, then "all"
    (the worst top-k layer at each step), the real policy first, then each shadow."""
    require_shadows(run)
    layers = shadow_layers(run)
    late = late_rows(len(run.steps))
    policies = policy_violations(run)
    rows = []
    for layer in list(layers) + ["all"]:
        for label, values in policies:
            series = (worst_over_layers(values, layers) if layer == "all"
                      else values[:, layer])
            worst, row, late_mean, final = series_summary(series, late)
            rows.append((str(layer), label, worst, int(run.steps[row]), late_mean, final))
    return rows


def render_shadows(run):
    rows = shadow_table(run)
    steps = run.steps
    late = late_rows(len(steps))
    header = [
        f"shadow balancers of {run.path}: max violation (max - mean)/mean of the expert load per "
        f"top-k layer, steps {int(steps[0])} .. {int(steps[-1])} ({len(steps)} steps)",
        f"worst: the largest, at the step named; late mean: over the last {late} steps "
        f"({int(steps[-late])} .. {int(steps[-1])}, the last quarter); final: step "
        f"{int(steps[-1])}",
        "all: the worst top-k layer at each step; hash and forced layers left out (shadows route "
        "top-k layers only)",
        "A shadow routes the scores of the router trained under the real policy: how its rule "
        "would have balanced these scores, not how a model trained with it would have evolved.",
        "",
    ]
    cells = [["layer", "policy", "worst", "at step", "late mean", "final"]] + [
        [layer, label, f"{worst:.3f}", str(step), f"{late_mean:.3f}", f"{final:.3f}"]
        for layer, label, worst, step, late_mean, final in rows]
    aligns = [["<", "<", ">", ">", ">", ">"]] + [[">", "<", ">", ">", ">", ">"]] * len(rows)
    grid = pad_rows(cells, aligns)
    lines = ["  ".join(grid[0]).rstrip()]
    for i, (row, cell) in enumerate(zip(rows, grid[1:])):
        if i and row[0] != rows[i - 1][0]:
            lines.append("")                       # a blank line between layers
        lines.append("  ".join(cell).rstrip())
    return "\n".join(header + lines) + "\n"

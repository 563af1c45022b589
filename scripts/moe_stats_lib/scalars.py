"""The per-step scalars of a run under the names both exports give them: `tensorboard` writes
them as TensorBoard tags, `mlflow` logs them as MLflow metrics, with the same strings, so a chart
of one has the name of the other.

Names are metric first: the part before the first "/" is the quantity (TensorBoard's section),
the part after it the layer, rank, phase or policy it is of, so one section holds a metric of
every layer:
    loss/train, loss/balance                  /steps/loss, /steps/balance_loss
    loss/z                                    /steps/z_loss (files that have it)
    optim/lr, optim/grad_norm                 /steps/lr, /steps/grad_norm
    throughput/tokens_per_s, throughput/step_time_s
    phase_time_ms/PHASE                       /perf/phase_time, mean over ranks, milliseconds
    METRIC/layerLL                            metrics.METRICS of layer LL (two digits; a metric
                                              NaN at a step, e.g. drop_rate of a file without
                                              /routing/dropped, is not written)
    drop_rate/all                             the overall drop rate of the step (dropped /
                                              selected assignments, all layers; files with
                                              /routing/dropped)
    assignments/rankRR                        /routing/rank_load summed over layers
    worst_violation/POLICY                    runs with --shadow: the worst max violation over
                                              the top-k layers of the run's own policy (POLICY
                                              "real") and of each shadow balancer (its rule)
and TensorBoard's histograms (MLflow has none):
    expert_load/layerLL                       the E expert loads of layer LL, assignments

A part is written with the characters MLflow allows in a metric name (letters, digits, "_", "-",
".", ":"); any other becomes "_" (phases and rules are plain words and rule texts such as
"sign:0.001", so none is changed in practice).

Shapes: N complete rows (steps), L layers, E experts, W ranks.
"""
from __future__ import annotations

import datetime
import re

import numpy as np

from .metrics import METRICS, layer_metrics, step_drop_rate
from .shadows import REAL, policy_violations, worst_over_layers
from .stats_file import shadow_rules, topk_mask

_NOT_ALLOWED = re.compile(r"[^\w.:\-]")


def name_part(text):
    """`text` with the characters MLflow does not allow in a name replaced by "_" (and "_" for
    a text of dots only, which MLflow reads as a path)."""
    text = _NOT_ALLOWED.sub("_", str(text))
    return "_" if text.strip(".") == "" else text


def scalar_name(metric, part):
    """The name of quantity `metric` of `part` (a layer, rank, phase, policy or kind of loss)."""
    return f"{metric}/{name_part(part)}"


def layer_name(metric, layer):
    return scalar_name(metric, f"layer{layer:02d}")


def rank_name(metric, rank):
    return scalar_name(metric, f"rank{rank:02d}")


def scalar_series(run):
    """[(name, [N] values)] of every scalar, in the order written."""
    series = [(scalar_name("loss", "train"), run.data["steps/loss"]),
              (scalar_name("loss", "balance"), run.data["steps/balance_loss"]),
              (scalar_name("optim", "lr"), run.data["steps/lr"]),
              (scalar_name("optim", "grad_norm"), run.data["steps/grad_norm"]),
              (scalar_name("throughput", "tokens_per_s"), run.data["steps/tokens_per_s"])]
    if "steps/z_loss" in run.data:
        series.append((scalar_name("loss", "z"), run.data["steps/z_loss"]))
    if "steps/step_time_s" in run.data:
        series.append((scalar_name("throughput", "step_time_s"), run.data["steps/step_time_s"]))
    if "perf/phase_time" in run.data:
        with np.errstate(invalid="ignore"):
            mean_ms = 1e3 * np.nanmean(run.data["perf/phase_time"].astype(np.float64), axis=1)
        series += [(scalar_name("phase_time_ms", name), mean_ms[:, i])
                   for i, name in enumerate(run.phases)]
    metrics = layer_metrics(run)
    for name in METRICS:
        series += [(layer_name(name, layer), metrics[name][:, layer])
                   for layer in range(run.num_layers)]
        if name == "drop_rate" and step_drop_rate(run) is not None:
            series.append((scalar_name("drop_rate", "all"), step_drop_rate(run)))
    per_rank = np.asarray(run.data["routing/rank_load"], dtype=np.float64).sum(axis=1)  # [N, W]
    series += [(rank_name("assignments", r), per_rank[:, r]) for r in range(per_rank.shape[1])]
    topk = np.nonzero(topk_mask(run))[0]
    if shadow_rules(run) and topk.size:
        series += [(scalar_name("worst_violation", "real" if label == REAL else label),
                    worst_over_layers(values, topk)) for label, values in policy_violations(run)]
    return series


def created_time(run):
    """Seconds since the epoch of the `created` attribute (of the newest file); 0 when it
    cannot be parsed."""
    text = str(run.attrs.get("created", ""))
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def wall_times(run):
    """[N] wall time at the end of each step: the summed step times (NaN counted as 0), placed so
    that the newest file's first step starts at its `created` time (older files' rows before)."""
    if "steps/step_time_s" in run.data:
        times = np.nan_to_num(run.data["steps/step_time_s"].astype(np.float64))
    else:
        times = np.zeros(len(run.steps))
    ends = np.cumsum(times)
    newest_start = len(run.steps) - (run.segments[-1].rows if run.segments else len(run.steps))
    offset = ends[newest_start - 1] if newest_start > 0 else 0.0
    return created_time(run) + ends - offset

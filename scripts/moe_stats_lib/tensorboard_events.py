"""`moe_stats.py tensorboard`: a run as TensorBoard event files, written with the tensorboard
package's own writer (EventFileWriter and its protocol buffers; no TensorFlow, no torch), so
`tensorboard --logdir LOGDIR` shows the run beside others.

Each run goes to LOGDIR/LABEL (LABEL: --label, else the file's name without .h5), one event per
step holding every scalar, at the step's wall time (the file's `created` time plus the summed
step times). Tags, grouped by the part before the first "/" (TensorBoard's sections):
    loss/train, loss/balance                  /steps/loss, /steps/balance_loss
    loss/z                                    /steps/z_loss (files that have it)
    optim/lr, optim/grad_norm                 /steps/lr, /steps/grad_norm
    throughput/tokens_per_s, throughput/step_time_s
    phase_time_ms/PHASE                       /perf/phase_time, mean over ranks, milliseconds
    balance/layerLL/METRIC                    metrics.METRICS of layer LL (two digits; a metric
                                              NaN at a step, e.g. drop_rate of a file without
                                              /routing/dropped, is not written)
    routing/drop_rate                         the overall drop rate of the step (dropped /
                                              selected assignments, all layers; files with
                                              /routing/dropped)
    ranks/rankRR/assignments                  /routing/rank_load summed over layers
    expert_load/layerLL (histogram)           the E expert loads of layer LL, assignments
    shadow/POLICY/worst_violation             runs with --shadow: the worst max violation over
                                              the top-k layers of the run's own policy (POLICY
                                              "real") and of each shadow balancer (its rule)

Shapes: N complete rows (steps), L layers, E experts, W ranks.
"""
from __future__ import annotations

import datetime
import glob
import os

import numpy as np

from .metrics import METRICS, layer_metrics, step_drop_rate
from .shadows import REAL, policy_violations, worst_over_layers
from .stats_file import StatsError, shadow_rules, topk_mask

EVENT_GLOB = "events.out.tfevents.*"
HISTOGRAM_BUCKETS = 32


def tensorboard_modules():
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise StatsError("tensorboard needs the tensorboard package (scripts/setup.sh installs "
                         "it)") from None
    return EventFileWriter, event_pb2, summary_pb2


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


def layer_tag(layer, name):
    return f"balance/layer{layer:02d}/{name}"


def scalar_series(run):
    """[(tag, [N] values)] of every scalar written."""
    series = [("loss/train", run.data["steps/loss"]),
              ("loss/balance", run.data["steps/balance_loss"]),
              ("optim/lr", run.data["steps/lr"]),
              ("optim/grad_norm", run.data["steps/grad_norm"]),
              ("throughput/tokens_per_s", run.data["steps/tokens_per_s"])]
    if "steps/z_loss" in run.data:
        series.append(("loss/z", run.data["steps/z_loss"]))
    if "steps/step_time_s" in run.data:
        series.append(("throughput/step_time_s", run.data["steps/step_time_s"]))
    if "perf/phase_time" in run.data:
        with np.errstate(invalid="ignore"):
            mean_ms = 1e3 * np.nanmean(run.data["perf/phase_time"].astype(np.float64), axis=1)
        series += [(f"phase_time_ms/{name}", mean_ms[:, i]) for i, name in enumerate(run.phases)]
    drop_rate = step_drop_rate(run)
    if drop_rate is not None:
        series.append(("routing/drop_rate", drop_rate))
    metrics = layer_metrics(run)
    for layer in range(run.num_layers):
        series += [(layer_tag(layer, name), metrics[name][:, layer]) for name in METRICS]
    per_rank = np.asarray(run.data["routing/rank_load"], dtype=np.float64).sum(axis=1)  # [N, W]
    series += [(f"ranks/rank{r:02d}/assignments", per_rank[:, r])
               for r in range(per_rank.shape[1])]
    topk = np.nonzero(topk_mask(run))[0]
    if shadow_rules(run) and topk.size:
        series += [(f"shadow/{'real' if label == REAL else label}/worst_violation",
                    worst_over_layers(values, topk)) for label, values in policy_violations(run)]
    return series


def histogram(summary_pb2, values, edges):
    """HistogramProto of `values` over the bucket right edges `edges` (the last is +inf)."""
    values = np.asarray(values, dtype=np.float64)
    counts = np.bincount(np.searchsorted(edges, values, side="left"), minlength=len(edges))
    return summary_pb2.HistogramProto(
        min=float(values.min()), max=float(values.max()), num=float(values.size),
        sum=float(values.sum()), sum_squares=float((values * values).sum()),
        bucket_limit=[float(e) for e in edges], bucket=[float(c) for c in counts[:len(edges)]])


def run_folder(logdir, label, overwrite):
    """LOGDIR/LABEL, created; refuses one holding event files unless overwrite (then removes
    only those files)."""
    folder = os.path.join(logdir, label)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise StatsError(f"{folder}: cannot create the folder ({err.strerror})") from None
    old = sorted(glob.glob(os.path.join(folder, EVENT_GLOB)))
    if old and not overwrite:
        raise StatsError(f"{folder}: already holds {len(old)} event file(s); TensorBoard would "
                         f"show both; pass --overwrite to replace them, or another --label")
    for path in old:
        os.remove(path)
    return folder


def write_events(run, logdir, label=None, overwrite=False):
    """Writes the run's events into LOGDIR/LABEL; returns the event file's path."""
    EventFileWriter, event_pb2, summary_pb2 = tensorboard_modules()
    label = label or os.path.splitext(run.name)[0]
    folder = run_folder(logdir, label, overwrite)
    series = scalar_series(run)
    load = run.data["routing/expert_load"].astype(np.float64)              # [N, L, E]
    top = max(float(load.max()), 1.0)
    edges = list(np.linspace(0.0, top, HISTOGRAM_BUCKETS + 1)[1:]) + [float(np.finfo(float).max)]
    edges = np.asarray(edges)
    times = wall_times(run)
    writer = EventFileWriter(folder, max_queue_size=1024, flush_secs=3600)
    try:
        for row, step in enumerate(run.steps):
            values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(data[row]))
                      for tag, data in series if np.isfinite(data[row])]
            values += [summary_pb2.Summary.Value(
                tag=f"expert_load/layer{layer:02d}",
                histo=histogram(summary_pb2, load[row, layer], edges))
                for layer in range(run.num_layers)]
            writer.add_event(event_pb2.Event(wall_time=float(times[row]), step=int(step),
                                             summary=summary_pb2.Summary(value=values)))
    finally:
        writer.close()
    written = sorted(glob.glob(os.path.join(folder, EVENT_GLOB)))
    return written[-1] if written else folder

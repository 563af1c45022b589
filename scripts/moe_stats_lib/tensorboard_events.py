"""`moe_stats.py tensorboard`: a run as TensorBoard event files, written with the tensorboard
package's own writer (EventFileWriter and its protocol buffers; no TensorFlow, no torch), so
`tensorboard --logdir LOGDIR` shows the run beside others.

Each run goes to LOGDIR/LABEL (LABEL: --label, else the file's name without .h5), one event per
step holding every scalar, at the step's wall time (the file's `created` time plus the summed
step times). Tags are metric first (scalars.py, whose names the `mlflow` command logs too), so
TensorBoard's sections, the part before the first "/", each hold one quantity of every layer,
rank, phase or policy: loss/train, optim/lr, phase_time_ms/PHASE, violation/layerLL (every
metric of metrics.METRICS), drop_rate/all, assignments/rankRR, worst_violation/POLICY; and the
histograms expert_load/layerLL, the E expert loads of layer LL.

TensorBoard's scalars dashboard still draws each tag in a chart of its own. So that one chart
holds every layer (every rank, phase, policy) of a quantity, the file also holds a layout for the
custom scalars dashboard (its "CUSTOM SCALARS" tab): one multi-line chart per metric with more
than one tag, matching its tags by a regular expression, grouped by what they run over (layers,
ranks, the rest). It is written with the tensorboard package's protocol buffers, as the plugin's
own summary.pb would write it (which needs TensorFlow).

Shapes: N complete rows (steps), L layers, E experts, W ranks.
"""
from __future__ import annotations

import glob
import os

import numpy as np

from .scalars import layer_name, scalar_series, wall_times
from .stats_file import StatsError

EVENT_GLOB = "events.out.tfevents.*"
HISTOGRAM_BUCKETS = 32


def tensorboard_modules():
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        import tensorboard.plugins.custom_scalar  # noqa: F401  (the layout's plugin is there)
    except ImportError:
        raise StatsError("tensorboard needs the tensorboard package (scripts/setup.sh installs "
                         "it)") from None
    return EventFileWriter, event_pb2, summary_pb2


def histogram(summary_pb2, values, edges):
    """HistogramProto of `values` over the bucket right edges `edges` (the last is +inf)."""
    values = np.asarray(values, dtype=np.float64)
    counts = np.bincount(np.searchsorted(edges, values, side="left"), minlength=len(edges))
    return summary_pb2.HistogramProto(
        min=float(values.min()), max=float(values.max()), num=float(values.size),
        sum=float(values.sum()), sum_squares=float((values * values).sum()),
        bucket_limit=[float(e) for e in edges], bucket=[float(c) for c in counts[:len(edges)]])


LAYOUT_GROUPS = (("per layer", r"layer\d+"), ("per rank", r"rank\d+"), ("other", r"[^/]+"))


def custom_scalars_layout(names):
    """The custom scalars dashboard's Layout of the scalar names: per metric (the part before "/")
    with more than one name, one multi-line chart of the regular expression ^METRIC/(SUFFIX)$,
    in the group (LAYOUT_GROUPS) whose SUFFIX pattern every one of its names matches."""
    import re
    from tensorboard.plugins.custom_scalar import layout_pb2
    metrics = {}
    for name in names:
        metric, suffix = name.split("/", 1)
        metrics.setdefault(metric, []).append(suffix)
    categories = []
    for title, pattern in LAYOUT_GROUPS:
        charts = []
        for metric, suffixes in list(metrics.items()):
            if len(suffixes) > 1 and all(re.fullmatch(pattern, x) for x in suffixes):
                regex = f"^{re.escape(metric)}/{pattern}$"
                charts.append(layout_pb2.Chart(
                    title=metric, multiline=layout_pb2.MultilineChartContent(tag=[regex])))
                del metrics[metric]
        if charts:
            categories.append(layout_pb2.Category(title=title, chart=charts))
    return layout_pb2.Layout(category=categories)


def layout_summary(summary_pb2, layout):
    """The Summary that carries `layout` to the custom scalars plugin: its tag, its plugin name,
    and the serialised Layout as a string tensor."""
    from tensorboard.compat.proto import tensor_pb2, types_pb2
    from tensorboard.plugins.custom_scalar import metadata
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING,
                                    string_val=[layout.SerializeToString()])
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag=metadata.CONFIG_SUMMARY_TAG, metadata=metadata.create_summary_metadata(),
        tensor=tensor)])


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
        # Charts for the tags written: a series with no finite value has none.
        layout = custom_scalars_layout([name for name, data in series
                                        if np.isfinite(np.asarray(data, dtype=np.float64)).any()])
        writer.add_event(event_pb2.Event(wall_time=float(times[0]) if len(times) else 0.0,
                                         step=int(run.steps[0]) if len(run.steps) else 0,
                                         summary=layout_summary(summary_pb2, layout)))
        for row, step in enumerate(run.steps):
            values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(data[row]))
                      for tag, data in series if np.isfinite(data[row])]
            values += [summary_pb2.Summary.Value(
                tag=layer_name("expert_load", layer),
                histo=histogram(summary_pb2, load[row, layer], edges))
                for layer in range(run.num_layers)]
            writer.add_event(event_pb2.Event(wall_time=float(times[row]), step=int(step),
                                             summary=summary_pb2.Summary(value=values)))
    finally:
        writer.close()
    written = sorted(glob.glob(os.path.join(folder, EVENT_GLOB)))
    return written[-1] if written else folder

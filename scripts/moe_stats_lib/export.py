"""`moe_stats.py export`: the run as tidy long tables (one row per observation, one column per
variable) in CSV or Parquet, which pandas.read_csv and pandas.read_parquet load as they are.
A resumed run is exported whole (chain.load_run), each row naming the file it came from.

Tables (--what), their rows and columns:
    steps   step:                     step, file, loss, balance_loss, grad_norm, lr,
                                      tokens_per_s, step_time_s, drop_rate (the overall drop
                                      rate; files with /routing/dropped)
    layers  step x layer:             step, layer, routing, and every metric of metrics.METRICS
                                      (drop_rate among them: NaN without /routing/dropped)
    loads   step x layer x expert:    step, layer, routing, expert, load, load_ratio, dropped
                                      (files with /routing/dropped; load counts them: before
                                      drops)
    bias    step x layer x expert:    step, layer, routing, expert, bias
    ranks   step x layer x rank:      step, layer, routing, rank, load (ranks a file did not
                                      have are left out, not NaN)
    phases  step x rank x phase:      step, rank, phase, seconds
    traces  traced step x layer x token x slot: step, layer, routing, token, token_id,
                                      position, rank, slot, expert, weight
    shadow_violation  step x policy x top-k layer: step, policy, layer, max_violation (runs with
                                      --shadow: policy "real" is the run's own, then each
                                      shadow balancer's rule)

Shapes: N complete rows (steps), L layers, E experts, W ranks.
"""
from __future__ import annotations

import os

import numpy as np

from .metrics import layer_metrics, load_ratio, step_drop_rate
from .shadows import REAL, policy_violations, require_shadows, shadow_layers
from .stats_file import StatsError
from .traces import load_traces

TABLES = ("steps", "layers", "loads", "bias", "ranks", "phases", "traces", "shadow_violation")
FORMATS = ("csv", "parquet")
STEP_COLUMNS = ("loss", "balance_loss", "grad_norm", "lr", "tokens_per_s", "step_time_s")


def pandas():
    try:
        import pandas as pd
    except ImportError:
        raise StatsError("export needs pandas (scripts/setup.sh installs it)") from None
    return pd


def file_column(run):
    """[N] the base name of the file each row comes from."""
    return np.concatenate([np.full(seg.rows, os.path.basename(seg.path), dtype=object)
                           for seg in run.segments]) if run.segments else np.full(
        len(run.steps), run.name, dtype=object)


def grid(run, *sizes):
    """Index arrays of the product rows x sizes..., flattened in C order: (rows, i, j, ...)."""
    mesh = np.meshgrid(np.arange(len(run.steps)), *[np.arange(n) for n in sizes],
                       indexing="ij")
    return [m.reshape(-1) for m in mesh]


def routing_column(run, layer_idx):
    pd = pandas()
    kinds = sorted(set(run.routing))
    return pd.Categorical(np.asarray(run.routing, dtype=object)[layer_idx], categories=kinds)


def table_steps(run):
    pd = pandas()
    frame = {"step": run.steps.astype(np.int64), "file": file_column(run)}
    for name in STEP_COLUMNS:
        if f"steps/{name}" in run.data:
            frame[name] = run.data[f"steps/{name}"].astype(np.float64)
    drop_rate = step_drop_rate(run)
    if drop_rate is not None:
        frame["drop_rate"] = drop_rate
    return pd.DataFrame(frame)


def table_layers(run):
    pd = pandas()
    rows, layer = grid(run, run.num_layers)
    frame = {"step": run.steps[rows].astype(np.int64), "layer": layer.astype(np.int64),
             "routing": routing_column(run, layer)}
    for name, values in layer_metrics(run).items():
        frame[name] = values.reshape(-1)
    return pd.DataFrame(frame)


def per_expert(run, column, values):
    pd = pandas()
    rows, layer, expert = grid(run, run.num_layers, run.num_experts)
    return pd.DataFrame({"step": run.steps[rows].astype(np.int64),
                         "layer": layer.astype(np.int64), "routing": routing_column(run, layer),
                         "expert": expert.astype(np.int64), **{column: values}})


def table_loads(run):
    load = run.data["routing/expert_load"]
    frame = per_expert(run, "load", load.reshape(-1).astype(np.int64))
    frame["load_ratio"] = load_ratio(load).reshape(-1)
    if "routing/dropped" in run.data:
        frame["dropped"] = run.data["routing/dropped"].reshape(-1).astype(np.int64)
    return frame


def table_bias(run):
    return per_expert(run, "bias", run.data["routing/bias"].reshape(-1).astype(np.float64))


def table_ranks(run):
    pd = pandas()
    load = run.data["routing/rank_load"]                      # [N, L, W], NaN-padded in chains
    rows, layer, rank = grid(run, run.num_layers, load.shape[2])
    present = rank < run.world_size_of_rows()[rows]
    values = load.reshape(-1)[present]
    return pd.DataFrame({"step": run.steps[rows][present].astype(np.int64),
                         "layer": layer[present].astype(np.int64),
                         "routing": routing_column(run, layer[present]),
                         "rank": rank[present].astype(np.int64),
                         "load": np.asarray(values, dtype=np.float64).astype(np.int64)})


def table_phases(run):
    pd = pandas()
    if "perf/phase_time" not in run.data:
        raise StatsError(f"{run.path}: no /perf/phase_time to export")
    times = run.data["perf/phase_time"]                       # [N, W, num_phases]
    rows, rank, phase = grid(run, times.shape[1], times.shape[2])
    values = times.reshape(-1).astype(np.float64)
    keep = ~np.isnan(values)           # ranks or phases a file of a chain did not have
    names = np.asarray(run.phases, dtype=object)
    return pd.DataFrame({"step": run.steps[rows][keep].astype(np.int64),
                         "rank": rank[keep].astype(np.int64),
                         "phase": pd.Categorical(names[phase[keep]], categories=list(run.phases)),
                         "seconds": values[keep]})


def table_traces(run):
    pd = pandas()
    blocks = load_traces(run)
    if not blocks:
        raise StatsError(f"{run.path}: no traced steps to export (the run wrote no /trace rows; "
                         f"moe_rt writes them with --trace-every N)")
    parts = []
    for block in blocks:
        m, num_layers, tokens, k = block.experts.shape
        row, layer, token, slot = (a.reshape(-1) for a in np.meshgrid(
            np.arange(m), np.arange(num_layers), np.arange(tokens), np.arange(k),
            indexing="ij"))
        parts.append(pd.DataFrame({
            "step": block.steps[row].astype(np.int64), "layer": layer.astype(np.int64),
            "routing": routing_column(run, layer), "token": token.astype(np.int64),
            "token_id": block.token_id[row, token].astype(np.int64),
            "position": block.position[row, token].astype(np.int64),
            "rank": block.rank[row, token].astype(np.int64), "slot": slot.astype(np.int64),
            "expert": block.experts.reshape(-1).astype(np.int64),
            "weight": block.weights.reshape(-1).astype(np.float64)}))
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def table_shadow_violation(run):
    """The max violation of the run's own policy ("real") and of each shadow balancer, per step
    and top-k layer (a shadow routes no other)."""
    pd = pandas()
    require_shadows(run)
    layers = shadow_layers(run)
    policies = policy_violations(run)
    labels = ["real" if label == REAL else label for label, _ in policies]
    values = np.stack([v[:, layers] for _, v in policies], axis=1)       # [N, policies, L_topk]
    rows, policy, layer = grid(run, len(policies), len(layers))
    return pd.DataFrame({"step": run.steps[rows].astype(np.int64),
                         "policy": pd.Categorical(np.asarray(labels, dtype=object)[policy],
                                                  categories=labels),
                         "layer": layers[layer].astype(np.int64),
                         "max_violation": values.reshape(-1)})


BUILDERS = {"steps": table_steps, "layers": table_layers, "loads": table_loads,
            "bias": table_bias, "ranks": table_ranks, "phases": table_phases,
            "traces": table_traces, "shadow_violation": table_shadow_violation}
assert tuple(BUILDERS) == TABLES


def build_table(run, what):
    return BUILDERS[what](run)


def parse_what(text):
    """--what: one table, a comma-separated list, or "all"."""
    if text == "all":
        return list(TABLES)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in TABLES]
    if unknown or not names:
        raise StatsError(f"--what {text!r}: expected one or more of {', '.join(TABLES)} "
                         f"(comma-separated) or all")
    return list(dict.fromkeys(names))


def write_table(frame, path, fmt):
    try:
        if fmt == "csv":
            frame.to_csv(path, index=False)
        else:
            try:
                frame.to_parquet(path, index=False)
            except ImportError:
                raise StatsError("export --format parquet needs pyarrow (scripts/setup.sh "
                                 "installs it)") from None
    except OSError as err:
        raise StatsError(f"{path}: cannot write ({err.strerror or err})") from None
    return path


def export(run, what, fmt, out_path, stdout):
    """Writes the tables `what` of `run`; returns the paths written (none when a single CSV table
    goes to `stdout`). out_path: the file for one table, a folder (created) for several; None
    for one CSV table on stdout."""
    if fmt not in FORMATS:
        raise StatsError(f"--format {fmt!r}: expected csv or parquet")
    if out_path is None:
        if len(what) == 1 and fmt == "csv":
            build_table(run, what[0]).to_csv(stdout, index=False)
            return []
        raise StatsError("name the output with -o: a file for one table, a folder for several "
                         "(only one CSV table can go to stdout)")
    if len(what) == 1 and not os.path.isdir(out_path):
        return [write_table(build_table(run, what[0]), out_path, fmt)]
    try:
        os.makedirs(out_path, exist_ok=True)
    except OSError as err:
        raise StatsError(f"{out_path}: cannot create the output folder ({err.strerror})") from None
    return [write_table(build_table(run, name), os.path.join(out_path, f"{name}.{fmt}"), fmt)
            for name in what]

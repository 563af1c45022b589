"""`moe_stats.py summary`: the key facts of one run as text: configuration, steps, loss against
the data's entropy floor, throughput, and the balance of each layer at a glance.

Shapes: N complete rows (steps), L layers.
"""
from __future__ import annotations

import numpy as np

from .stats_file import (entropy_floor, parse_config_text, rank_overload, routing_label,
                         topk_mask)
from .variance import all_layer_variances, pad_rows

SUMMARY_CONFIG_KEYS = (
    "score-func", "route-scale", "bias-update-rate", "seq-aux-loss-weight", "force-balance",
    "lr", "warmup-steps", "grad-clip",
)


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
    var = all_layer_variances(run)  # recomputed, as the variance table does
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

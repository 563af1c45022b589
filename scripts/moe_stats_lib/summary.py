"""`moe_stats.py summary`: the key facts of one run as text: configuration, the files of a
resumed run, steps, loss against the data's entropy floor, throughput, the assignments dropped by
the token capacity of a run with --capacity-factor, the shadow balancers of a run with --shadow,
and the balance of each layer at a glance. Every figure is over the whole run, all its files.

Shapes: N complete rows (steps), L layers.
"""
from __future__ import annotations

import os

import numpy as np

from .metrics import (capacity_on, collapse_ceiling, cross_layer_percentiles, drop_fraction,
                      layer_metrics)
from .shadows import policy_violations, worst_over_layers
from .stats_file import (entropy_floor, parse_config_text, rank_overload, routing_label,
                         shadow_rules, topk_mask)
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
        ("ranks", f"{a.get('world_size', '?')} (EP group {a.get('ep_size', '?')})"
                  + hosts_note(a) + world_sizes_note(run)),
        ("seed", f"{a.get('seed', '?')}"),
        ("data", f"{a.get('data', '?')}"),
    ] + ([("val data", a["val_data"])] if "val_data" in a else []) + [
        ("shape", f"{run.num_layers} layers ({num_hash} hash, {int(mask.sum())} top-k), "
                  f"{run.num_experts} experts, top-k {a.get('top_k', '?')}, vocab "
                  f"{a.get('vocab', '?')}, seq-len {a.get('seq_len', '?')}, batch-per-rank "
                  f"{a.get('batch_per_rank', '?')}"),
        ("config", picked or "(no config text)"),
    ]


def hosts_note(attrs):
    """' on 2 hosts' from the num_hosts attribute; '' in files written before it existed."""
    hosts = attrs.get("num_hosts")
    if not isinstance(hosts, int) or isinstance(hosts, bool):
        return ""
    return f" on {hosts} host{'s' if hosts != 1 else ''}"


def summary_cross_host_lines(run):
    """The share of dispatched rows that crossed hosts, and of token copies (a token once per
    other host holding one of its experts, per token), over the whole run and at the last step,
    in all and per layer; no lines for a file without the counts."""
    data = {name: run.data.get(f"routing/{name}")
            for name in ("cross_host_rows", "dispatch_rows", "cross_host_tokens")}
    if data["cross_host_rows"] is None or data["dispatch_rows"] is None:
        return []
    dispatched = np.asarray(data["dispatch_rows"], dtype=np.float64)
    k = run.attrs.get("top_k")
    parts = [("rows crossing hosts in dispatch", data["cross_host_rows"], dispatched,
              "rows sent to an expert owner on another host / rows dispatched")]
    selected = run.data.get("routing/expert_load")
    if (data["cross_host_tokens"] is not None and selected is not None and isinstance(k, int)
            and k > 0):
        # Tokens: the selection's T*K assignments / K (a token capacity's drops leave the tokens
        # as they were, not the rows dispatched).
        tokens = np.asarray(selected, dtype=np.float64).sum(axis=2) / k
        parts.append(("token copies crossing hosts", data["cross_host_tokens"], tokens,
                      "a token once per other host holding one of its experts / tokens"))

    def share(c, d):
        return f"{100.0 * c / d:.1f}%" if d > 0 else "-"

    lines = [""]
    for what, crossed, total, meaning in parts:
        crossed = np.asarray(crossed, dtype=np.float64)
        per_layer = ", ".join(f"{layer}: {share(crossed[:, layer].sum(), total[:, layer].sum())}"
                              for layer in range(crossed.shape[1]))
        lines += [f"{what}: {share(crossed.sum(), total.sum())} over the run, "
                  f"{share(crossed[-1].sum(), total[-1].sum())} at the last step ({meaning})",
                  f"  per layer over the run: {per_layer}"]
    return lines


def world_sizes_note(run):
    """'; by file: 8, 8, 2' when the files of a resumed run differ in world size, else ''."""
    sizes = [seg.world_size for seg in run.segments if seg.rows]
    if len(set(sizes)) < 2:
        return ""
    return "; by file: " + ", ".join(str(w) for w in sizes)


def segment_text(segment, predecessor):
    """One file of a chain: its steps, ranks, path, and where it resumed from."""
    steps = (f"steps {segment.first_step} .. {segment.last_step}" if segment.rows
             else "no steps kept")
    text = f"{steps} on {segment.world_size} ranks: {segment.path}"
    if segment.resumed_from is not None:
        text += (f", resumed after step {segment.resumed_from_step} from "
                 f"{os.path.basename(predecessor.path)}")
        named = os.path.join(os.path.dirname(segment.path), segment.resumed_from)
        if os.path.normpath(named) != os.path.normpath(predecessor.path):
            text += f" (found next to it; named {segment.resumed_from})"
    if segment.rows_dropped:
        text += f" ({segment.rows_dropped} later rows dropped: redone by its successor)"
    return text


def summary_segment_lines(run):
    """The files of a resumed run, oldest first, or where a file read alone resumed from; no
    lines for a run that was never resumed."""
    segments = run.segments
    first = segments[0]
    # The oldest file may have resumed a run that wrote no statistics file (--stats none).
    unrecorded = ([("resumed", f"after step {first.resumed_from_step} from a run that kept no "
                               f"statistics file")]
                  if first.resumed_from is None and first.resumed_from_step is not None else [])
    if len(segments) == 1:
        if first.resumed_from is None:
            return unrecorded
        return [("resumed", f"after step {first.resumed_from_step} from "
                            f"{first.resumed_from} (not read: this file alone)")]
    lines = unrecorded + [("files", f"{len(segments)}, oldest first")]
    for i, segment in enumerate(segments):
        lines.append(("", segment_text(segment, segments[i - 1] if i else None)))
    return lines


def tokens_per_s_median(run):
    """(median tokens/s, what it is over): without the first step of each file, which is slow
    (start-up); all steps when that leaves none."""
    tps = run.data["steps/tokens_per_s"]
    rows = [seg.rows for seg in run.segments] or [len(tps)]
    starts = np.cumsum([0] + rows[:-1])
    keep = np.ones(len(tps), dtype=bool)
    keep[[start for start, n in zip(starts, rows) if n]] = False
    if not keep.any():
        keep[:] = True
    what = ("median over steps after the first" if len(rows) < 2
            else "median over steps, without the first of each file")
    return float(np.median(tps[keep])), what


def summary_progress_lines(run):
    loss = run.data["steps/loss"]
    steps = run.steps
    best = int(np.nanargmin(loss)) if np.isfinite(loss).any() else 0
    loss_text = (f"first {loss[0]:.4f}, last {loss[-1]:.4f}, "
                 f"min {loss[best]:.4f} at step {int(steps[best])}")
    floor = entropy_floor(run)
    loss_text += ("; entropy floor unknown" if floor is None else
                  f"; entropy floor {floor:.4f} nats (last is {loss[-1] - floor:.4f} above)")
    median, what = tokens_per_s_median(run)
    return [
        ("steps", f"{len(steps)} (step {int(steps[0])} .. {int(steps[-1])})"),
        ("loss", loss_text),
    ] + summary_eval_lines(run) + [
        ("tokens/s", f"{median:.0f} ({what})"),
    ]


def summary_eval_lines(run):
    """The validation loss (first, last, best) and the balance on the validation tokens of the
    last evaluation, per top-k layer; no lines without validation rows."""
    if not run.eval or len(run.eval["eval/step"]) == 0:
        return []
    steps, loss = run.eval["eval/step"], run.eval["eval/loss"]
    best = int(np.nanargmin(loss)) if np.isfinite(loss).any() else 0
    text = (f"{len(steps)} evaluations of {int(run.eval['eval/tokens'][-1])} tokens; after step "
            f"{int(steps[0])} {loss[0]:.4f}, after step {int(steps[-1])} {loss[-1]:.4f}, "
            f"min {loss[best]:.4f} after step {int(steps[best])}")
    mask = topk_mask(run)
    viol = run.eval["eval/max_violation"][-1]
    layers = np.nonzero(mask)[0] if mask.any() else np.arange(run.num_layers)
    balance = ", ".join(f"{int(l)}: {viol[l]:.3f}" for l in layers)
    kind = "top-k layer" if mask.any() else "layer"
    lines = [("val loss", text),
             ("val balance", f"max violation on the validation tokens after step "
                             f"{int(steps[-1])}, per {kind}: {balance}")]
    if "eval/dropped" in run.eval and capacity_on(run):
        dropped, load = run.eval["eval/dropped"], run.eval["eval/expert_load"]
        lines.append(("val dropped", f"{percent(drop_fraction(dropped[-1], load[-1]))} of the "
                                     f"assignments on the validation tokens after step "
                                     f"{int(steps[-1])}, {percent(drop_fraction(dropped, load))} "
                                     f"over the {len(steps)} evaluations"))
    return lines


def percent(share):
    return f"{100.0 * share:.2f}%"


def summary_drop_lines(run):
    """The share of the selected assignments that the token capacity dropped (--capacity-factor),
    over the run and at the last step, in all and per layer; no lines for a dropless run (no
    capacity in its configuration and no drop counted)."""
    if not capacity_on(run):
        return []
    config = parse_config_text(run.attrs.get("config", ""))
    setting = ", ".join(f"{key} = {config[key]}" for key in ("capacity-factor", "drop-policy")
                        if key in config)
    setting = f"; {setting}" if setting else ""
    dropped = run.data.get("routing/dropped")
    if dropped is None:
        return [("dropped", f"unknown: a file of the run has no /routing/dropped (written before "
                            f"moe_rt counted drops){setting}")]
    load = run.data["routing/expert_load"]
    per_layer = ", ".join(f"{layer}: {percent(drop_fraction(dropped[:, layer], load[:, layer]))}"
                          for layer in range(run.num_layers))
    return [("dropped", f"{percent(drop_fraction(dropped, load))} of the assignments over the "
                        f"run, {percent(drop_fraction(dropped[-1], load[-1]))} at the last step "
                        f"(step {int(run.steps[-1])}){setting}"),
            ("", f"per layer over the run: {per_layer}")]


def summary_shadow_lines(run):
    """The worst max violation over the top-k layers at the last step, of the run's own policy
    and of each shadow balancer (`shadows` tells more); no lines for a run without --shadow or
    without top-k layers."""
    layers = np.nonzero(topk_mask(run))[0]
    if not shadow_rules(run) or layers.size == 0:
        return []
    worst = ", ".join(f"{label} {worst_over_layers(values, layers)[-1]:.3f}"
                      for label, values in policy_violations(run))
    return [("shadows", f"worst max violation over the top-k layers at step "
                        f"{int(run.steps[-1])}: {worst} (more: moe_stats.py shadows)")]


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


def summary_distribution_rows(run, metrics=None):
    """The expert-load distribution of each layer at the last step (metrics.py): the tokens per
    expert (min, p25, median, p75, max, std, CV), dead experts (now; steps with any, over the
    run), diversity exp(H)/E, the balance loss and the bias spread."""
    m = metrics or layer_metrics(run)
    rows = [["layer", "min", "p25", "p50", "p75", "max", "std", "cv", "dead", "dead steps",
             "diversity", "balance loss", "bias spread"]]
    for layer in range(run.num_layers):
        last = {name: values[-1, layer] for name, values in m.items()}
        dead_steps = int((m["dead"][:, layer] > 0).sum())
        bal = last["balance_loss"]
        rows.append([str(layer)] + [f"{last[k]:.0f}" if float(last[k]).is_integer()
                                    else f"{last[k]:.1f}"
                                    for k in ("min", "p25", "p50", "p75", "max")]
                    + [f"{last['std']:.1f}", f"{last['cv']:.3f}", f"{int(last['dead'])}",
                       f"{dead_steps}", f"{last['diversity']:.3f}",
                       "-" if bal != bal else f"{bal:.3e}", f"{last['bias_spread']:.4f}"])
    aligns = [["<"] + [">"] * (len(rows[0]) - 1)] + [[">"] * len(rows[0])] * run.num_layers
    return pad_rows(rows, aligns)


def summary_cross_layer_line(run, metrics):
    """Percentiles over the top-k layers (all layers without any) of the last step's max
    violation and CV, as Megatron-LM issue #2398 asks."""
    mask = topk_mask(run)
    layers = np.nonzero(mask)[0] if mask.any() else np.arange(run.num_layers)
    parts = []
    for name in ("violation", "cv"):
        q = cross_layer_percentiles(metrics[name][-1], layers)
        parts.append(f"{name} " + ", ".join(f"p{k} {v:.3f}" for k, v in q.items()))
    kind = "top-k" if mask.any() else "all"
    return f"across {kind} layers at the last step: " + "; ".join(parts)


def render_summary(run):
    pairs = (summary_config_lines(run) + summary_segment_lines(run) + summary_progress_lines(run)
             + summary_drop_lines(run) + summary_shadow_lines(run))
    width = max(len(key) for key, _ in pairs)
    lines = [f"{key.ljust(width)}  {value}" for key, value in pairs]
    lines += ["", "per-layer balance (variance of the expert load; violation (max - mean)/mean; "
                  "rank overload as stored)"]
    lines += ["  ".join(r).rstrip() for r in summary_layer_rows(run)]
    lines += summary_cross_host_lines(run)
    metrics = layer_metrics(run)
    ceiling = collapse_ceiling(run)
    mean = run.data["routing/expert_load"][-1].astype(np.float64).mean(axis=1)
    lines += ["", f"expert load at the last step (step {int(run.steps[-1])}; assignments per "
                  f"expert, mean {mean.mean():g}"
                  + (f", collapse at max = E/K x mean = {ceiling * mean.mean():g}"
                     if ceiling else "") + "; dead: experts with no assignment; diversity "
                  "exp(H)/E, 1 = even)"]
    lines += ["  ".join(r).rstrip() for r in summary_distribution_rows(run, metrics)]
    lines += [summary_cross_layer_line(run, metrics)]
    return "\n".join(lines) + "\n"

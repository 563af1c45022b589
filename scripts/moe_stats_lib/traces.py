"""`moe_stats.py traces`: what the per-token routing traces (/trace/*, written every --trace-every
steps) say about the router: how stable each token's experts are from one traced step to the
next, whether frequent tokens concentrate on some experts, and whether the bias changes the
choice (which needs every expert's score, not in the file).

Every traced step holds a different batch (the data source deals new samples each step), so a
token is followed by its id: at each traced step a token id's routing in a layer is its modal
top-k set, the set of experts its occurrences chose most often (ties: the smallest set in
lexicographic order). Definitions, per layer:
    changed        share of occurrences at traced step j+1 whose token id's modal set differs from
                   its modal set at step j (ids seen at both steps); hash layers give 0
    same-slot      where a trace slot holds the same token id at both steps (same rank, sequence
                   and position: repeated data), the share whose own top-k set changed
    frequent       the most common token ids that together make half of the occurrences; rare:
                   the rest. For each group: the diversity exp(H)/E of its assignments over
                   experts, and its most used expert with that expert's share of the group's
                   assignments (1/E when spread evenly)
    id focus       mean over occurrences of the share of the token id's occurrences that include
                   the id's most used expert (1 = an id always goes to the same expert; hash: 1)

Shapes: M traced steps, L layers, T traced tokens per traced step, K experts per token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .stats_file import StatsError, open_stats_file, row_of_step, routing_label

TRACE_DATASETS = ("trace/step", "trace/token_id", "trace/position", "trace/rank",
                  "trace/experts", "trace/weights")
# The top-k without the routing bias: in files written since moe_rt records it.
UNBIASED = "trace/experts_unbiased"


@dataclass(frozen=True)
class TraceBlock:
    """The traced steps of one file of a run (T is fixed within a file, and may differ between
    the files of a resumed run at another number of ranks)."""

    path: str
    steps: np.ndarray      # [M]
    token_id: np.ndarray   # [M, T]
    position: np.ndarray   # [M, T]
    rank: np.ndarray       # [M, T]
    experts: np.ndarray    # [M, L, T, K]
    weights: np.ndarray    # [M, L, T, K]
    experts_unbiased: np.ndarray = None  # [M, L, T, K], or None in files without it


def read_trace_block(path, first_step, last_step):
    """The trace rows of `path` whose step is in [first_step, last_step] (complete rows only:
    /trace/step written and not the fill value -1); None when the file has no /trace."""
    with open_stats_file(path) as f:
        if "trace" not in f:
            return None
        missing = [name for name in TRACE_DATASETS if name not in f]
        if missing:
            raise StatsError(f"{path}: /trace lacks /{missing[0]}")
        try:
            n = min(f[name].shape[0] for name in TRACE_DATASETS)
            steps = f["trace/step"][:n]
            while n > 0 and steps[n - 1] < 0:
                n -= 1
            keep = np.flatnonzero((steps[:n] >= first_step) & (steps[:n] <= last_step))
            data = {name: f[name][:n][keep] for name in TRACE_DATASETS}
            if UNBIASED in f and f[UNBIASED].shape[0] >= n:
                data[UNBIASED] = f[UNBIASED][:n][keep]
        except (OSError, RuntimeError) as err:
            raise StatsError(f"{path}: cannot read /trace, the file is truncated or damaged "
                             f"({str(err).splitlines()[0]})") from None
    return TraceBlock(path=path, steps=data["trace/step"], token_id=data["trace/token_id"],
                      position=data["trace/position"], rank=data["trace/rank"],
                      experts=data["trace/experts"], weights=data["trace/weights"],
                      experts_unbiased=data.get(UNBIASED))


def load_traces(run):
    """[TraceBlock] of every file of the run, oldest first, cut to the steps the run keeps from
    each file (a resumed run's predecessor: up to its successor's checkpoint). Empty blocks and
    files without /trace are left out."""
    blocks = []
    for segment in run.segments:
        if not segment.rows:
            continue
        block = read_trace_block(segment.path, segment.first_step, segment.last_step)
        if block is not None and len(block.steps):
            blocks.append(block)
    return blocks


def traced_rows(blocks):
    """[(step, block, row)] over every traced step, in step order."""
    return [(int(step), block, i) for block in blocks for i, step in enumerate(block.steps)]


def modal_sets(token_id, experts):
    """{token id: modal top-k set (a sorted tuple)} of one traced step of one layer.
    token_id [T], experts [T, K]."""
    sets = np.sort(experts, axis=1)
    counts = {}
    for tid, row in zip(token_id.tolist(), map(tuple, sets.tolist())):
        per_id = counts.setdefault(tid, {})
        per_id[row] = per_id.get(row, 0) + 1
    return {tid: min(per_id, key=lambda s: (-per_id[s], s)) for tid, per_id in counts.items()}


def stability(rows, layer):
    """[(step_from, step_to, changed, same_slot_changed or None, ids compared)] between
    consecutive traced steps of layer `layer`."""
    out = []
    for (s0, b0, i0), (s1, b1, i1) in zip(rows, rows[1:]):
        ids0, ids1 = b0.token_id[i0], b1.token_id[i1]
        modal0 = modal_sets(ids0, b0.experts[i0, layer])
        modal1 = modal_sets(ids1, b1.experts[i1, layer])
        common = [tid for tid in modal1 if tid in modal0]
        weight = {tid: 0 for tid in common}
        for tid in ids1.tolist():
            if tid in weight:
                weight[tid] += 1
        total = sum(weight.values())
        changed = (sum(w for tid, w in weight.items() if modal0[tid] != modal1[tid]) / total
                   if total else None)
        same_slot = None
        if ids0.shape == ids1.shape:
            same = ids0 == ids1
            if same.any():
                set0 = np.sort(b0.experts[i0, layer][same], axis=1)
                set1 = np.sort(b1.experts[i1, layer][same], axis=1)
                same_slot = float(np.mean(np.any(set0 != set1, axis=1)))
        out.append((s0, s1, changed, same_slot, len(common)))
    return out


def frequency_groups(token_ids):
    """(frequent ids, rare ids) over all traced occurrences: the most common ids that together
    make at least half of the occurrences, and the rest."""
    ids, counts = np.unique(np.concatenate([t.reshape(-1) for t in token_ids]),
                            return_counts=True)
    order = np.argsort(-counts, kind="stable")
    cumulative = np.cumsum(counts[order])
    cut = int(np.searchsorted(cumulative, cumulative[-1] / 2.0)) + 1
    return set(ids[order[:cut]].tolist()), set(ids[order[cut:]].tolist())


def group_profile(rows, layer, group, num_experts):
    """(occurrences, diversity, top expert, its share) of the token ids in `group` over every
    traced step of `layer`; None for an empty group."""
    hist = np.zeros(num_experts, dtype=np.float64)
    occurrences = 0
    for _, block, i in rows:
        mask = np.isin(block.token_id[i], list(group))
        occurrences += int(mask.sum())
        hist += np.bincount(block.experts[i, layer][mask].reshape(-1), minlength=num_experts)
    if occurrences == 0:
        return None
    p = hist / hist.sum()
    nz = p[p > 0]
    diversity = float(np.exp(-(nz * np.log(nz)).sum()) / num_experts)
    top = int(np.argmax(hist))
    return occurrences, diversity, top, float(p[top])


def id_focus(rows, layer, num_experts):
    """Mean over occurrences of the share of the id's occurrences that include its most used
    expert (all traced steps of `layer`)."""
    per_id = {}
    for _, block, i in rows:
        ids = block.token_id[i]
        experts = block.experts[i, layer]
        for tid, chosen in zip(ids.tolist(), experts.tolist()):
            hist = per_id.setdefault(tid, np.zeros(num_experts + 1, dtype=np.int64))
            hist[chosen] += 1
            hist[num_experts] += 1      # occurrences
    if not per_id:
        return None
    total = sum(h[num_experts] for h in per_id.values())
    return float(sum(h[:num_experts].max() for h in per_id.values()) / total)


def bias_agreement(run, rows, layer):
    """The agreement between the top-k with and without the bias in `layer`: the share of traced
    tokens whose two top-k sets are the same, over all traced steps, with the first and last
    step's share: (text, value or None)."""
    if rows and all(block.experts_unbiased is not None for _, block, _ in rows):
        shares = []
        for _, block, i in rows:
            chosen = np.sort(block.experts[i, layer], axis=1)
            unbiased = np.sort(block.experts_unbiased[i, layer], axis=1)
            shares.append(float(np.mean(np.all(chosen == unbiased, axis=1))))
        mean = float(np.mean(shares))
        return (f"{mean:.3f} (step {rows[0][0]}: {shares[0]:.3f}, step {rows[-1][0]}: "
                f"{shares[-1]:.3f})"), mean
    if "routing/bias" not in run.data:
        return "not computable: no /routing/bias", None
    bias_rows = []
    for step, _, _ in rows:
        try:
            bias_rows.append(run.data["routing/bias"][row_of_step(run, step), layer])
        except StatsError:
            return f"not computable: step {step} has no row in /routing/bias", None
    if all(not np.any(b) for b in bias_rows):
        return "1 (the bias is 0 at every traced step: both choices are the same)", 1.0
    return ("not computable: the bias is not 0, and this file's trace has no "
            "/trace/experts_unbiased (written by moe_rt since it records the top-k without "
            "the bias)"), None


def render_traces(run, blocks):
    rows = traced_rows(blocks)
    if not rows:
        return (f"{run.path}: no traced steps (the run wrote no /trace rows; use --trace-every "
                f"N)\n")
    steps = [s for s, _, _ in rows]
    num_experts = run.num_experts
    frequent, rare = frequency_groups([b.token_id[i] for _, b, i in rows])
    tokens = sorted({b.token_id.shape[1] for b in blocks})
    lines = [f"traced steps  {len(rows)}: {', '.join(map(str, steps[:12]))}"
             f"{', ...' if len(rows) > 12 else ''}",
             f"tokens        {' / '.join(map(str, tokens))} per traced step, "
             f"{len(frequent) + len(rare)} distinct ids; frequent: the {len(frequent)} most "
             f"common ids (half of the occurrences)", ""]
    lines.append("routing stability between consecutive traced steps (share of occurrences whose "
                 "token id's modal top-k set changed; mean over step pairs)")
    header = ["layer", "routing", "changed", "same-slot", "freq div", "freq top expert",
              "rare div", "id focus"]
    table = [header]
    for layer in range(run.num_layers):
        stab = stability(rows, layer)
        changed = [c for _, _, c, _, _ in stab if c is not None]
        slot = [c for _, _, _, c, _ in stab if c is not None]
        freq = group_profile(rows, layer, frequent, num_experts)
        rare_p = group_profile(rows, layer, rare, num_experts)
        focus = id_focus(rows, layer, num_experts)
        table.append([str(layer), routing_label(run.routing[layer]),
                      f"{np.mean(changed):.3f}" if changed else "n/a",
                      f"{np.mean(slot):.3f}" if slot else "n/a",
                      f"{freq[1]:.3f}" if freq else "n/a",
                      f"{freq[2]} ({freq[3]:.2f})" if freq else "n/a",
                      f"{rare_p[1]:.3f}" if rare_p else "n/a",
                      f"{focus:.3f}" if focus is not None else "n/a"])
    widths = [max(len(r[j]) for r in table) for j in range(len(header))]
    for i, r in enumerate(table):
        lines.append("  ".join(c.ljust(w) if (j == 1 or i == 0) else c.rjust(w)
                               for j, (c, w) in enumerate(zip(r, widths))).rstrip())
    lines += ["", f"uniform share of one expert: 1/E = {1.0 / num_experts:.3f}; "
                  f"diversity exp(H)/E: 1 = spread evenly over the experts", "",
              "top-k with and without the bias (agreement = share of tokens choosing the same set)"]
    for layer in range(run.num_layers):
        text, _ = bias_agreement(run, rows, layer)
        lines.append(f"  layer {layer}: {text}")
    return "\n".join(lines) + "\n"

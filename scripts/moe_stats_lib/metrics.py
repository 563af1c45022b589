"""Per-layer, per-step balance metrics computed from /routing/expert_load (cheap: [N, L, E]
integers), plus the stored per-layer balance loss and the bias spread. They are what the field
logs for MoE routing: Megatron-LM issue #2398 asks for the minimum, maximum, standard deviation
and percentiles of the tokens per expert; NeMo Automodel PR #1232 logs the utilisation ratio
(load / ideal load, 0 = a dead expert) and PR #1506 adds the fraction of dead experts and the
expert diversity exp(H) / E. `summary`, `export --what layers`, `tensorboard` and the figures
all take them from here, so every report agrees.

Definitions, for one layer at one step, with c[e] the assignments of expert e (E experts), the
mean m = sum(c) / E = T*K / E and p[e] = c[e] / sum(c):
    std, cv            population standard deviation of c; cv = std / m (0 when m = 0)
    min, max, pNN      of c over experts; percentiles by linear interpolation (numpy's default)
    max_ratio          max / m = 1 + max violation; at most E / K (COLLAPSE_CEILING): every token
                       sends one of its K slots to the same expert
    dead               experts with c[e] = 0; dead_frac = dead / E
    entropy            H = -sum p log p in nats (0 log 0 = 0); log E when balanced
    diversity          exp(H) / E: the effective fraction of experts used (1 = balanced)
    balance_loss       /routing/balance_loss as stored (NaN where the file has none)
    z_loss             /routing/z_loss, the router z-loss, as stored (NaN where the file has none)
    bias_spread        max - min of the router bias over experts (0 when the bias is off)
    bias_norm          L2 norm of the router bias over experts
    rank_overload      max / mean of the load over ranks (stored, else recomputed)
    cross_host_frac    dispatched rows that crossed hosts / rows dispatched (NaN where the file
                       does not count them)
    drop_rate          sum(d) / sum(c), d[e] the assignments of expert e that the token capacity
                       dropped (/routing/dropped; c counts them too: selected, before drops); 0
                       when sum(c) = 0, NaN where the file has no drop counts

A run's overall drop rate at a step (step_drop_rate) sums d and c over all layers and experts
first; over several steps (the run, all evaluations) drop_fraction sums over those too.

Shapes: N complete rows (steps), L layers, E experts.
"""
from __future__ import annotations

import numpy as np

from .stats_file import capacity_factor, cross_host_fraction, rank_overload

PERCENTILES = (5, 25, 50, 75, 95)

# Name -> (unit, one line), in the order tables and TensorBoard list them.
METRICS = {
    "variance": ("assignments^2", "population variance of the expert load over experts"),
    "std": ("assignments", "population standard deviation of the expert load"),
    "cv": ("1", "coefficient of variation of the expert load, std / mean"),
    "min": ("assignments", "load of the least loaded expert"),
    **{f"p{q:02d}": ("assignments", f"{q}th percentile of the expert load over experts")
       for q in PERCENTILES},
    "max": ("assignments", "load of the most loaded expert"),
    "max_ratio": ("1", "max / mean load (1 = balanced, E/K = collapse)"),
    "violation": ("1", "max violation (max - mean) / mean"),
    "dead": ("experts", "experts that received no assignment"),
    "dead_frac": ("1", "fraction of experts that received no assignment"),
    "entropy": ("nats", "entropy of the load distribution over experts (log E = balanced)"),
    "diversity": ("1", "exp(entropy) / E, the effective fraction of experts used"),
    "balance_loss": ("1", "balance loss of the layer, as stored"),
    "z_loss": ("1", "router z-loss of the layer, as stored"),
    "bias_spread": ("1", "max - min of the router bias over experts"),
    "bias_norm": ("1", "L2 norm of the router bias over experts"),
    "rank_overload": ("1", "max / mean of the load over ranks (1 = even)"),
    "cross_host_frac": ("1", "fraction of the dispatched rows sent to a rank on another host"),
    "drop_rate": ("1", "fraction of the layer's assignments dropped by the token capacity"),
}


def collapse_ceiling(run):
    """E / K, the largest possible max / mean load (every token picks the same expert); None when
    the file does not say K."""
    k = run.attrs.get("top_k")
    if not isinstance(k, (int, float)) or k <= 0:
        return None
    return run.num_experts / float(k)


def load_ratio(load):
    """load / mean load over the last axis (1 = balanced; 1 where the mean is 0)."""
    load = np.asarray(load, dtype=np.float64)
    mean = load.mean(axis=-1, keepdims=True)
    return np.divide(load, mean, out=np.ones_like(load), where=mean > 0)


def load_metrics(load):
    """The expert-load metrics of METRICS (those computed from the load alone) of load [..., E],
    each [...]."""
    load = np.asarray(load, dtype=np.float64)
    experts = load.shape[-1]
    mean = load.mean(axis=-1)
    std = load.std(axis=-1)
    total = load.sum(axis=-1, keepdims=True)
    p = np.divide(load, total, out=np.zeros_like(load), where=total > 0)
    plogp = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    entropy = -plogp.sum(axis=-1)
    ratio = lambda x: np.divide(x, mean, out=np.zeros_like(mean), where=mean > 0)  # noqa: E731
    out = {"variance": load.var(axis=-1), "std": std, "cv": ratio(std),
           "min": load.min(axis=-1)}
    quantiles = np.percentile(load, PERCENTILES, axis=-1)
    out.update({f"p{q:02d}": quantiles[i] for i, q in enumerate(PERCENTILES)})
    out["max"] = load.max(axis=-1)
    out["max_ratio"] = np.where(mean > 0, ratio(out["max"]), 1.0)
    out["violation"] = out["max_ratio"] - 1.0
    out["dead"] = (load == 0).sum(axis=-1).astype(np.float64)
    out["dead_frac"] = out["dead"] / experts
    out["entropy"] = entropy
    out["diversity"] = np.where(total[..., 0] > 0, np.exp(entropy) / experts, 0.0)
    return out


def layer_metrics(run):
    """{name: [N, L] float64} for every name of METRICS, in its order."""
    out = load_metrics(run.data["routing/expert_load"])
    for name in ("balance_loss", "z_loss"):
        stored = run.data.get(f"routing/{name}")
        out[name] = (np.asarray(stored, dtype=np.float64) if stored is not None
                     else np.full(out["max"].shape, np.nan))
    bias = run.data["routing/bias"].astype(np.float64)
    out["bias_spread"] = bias.max(axis=2) - bias.min(axis=2)
    out["bias_norm"] = np.sqrt((bias * bias).sum(axis=2))
    out["rank_overload"] = np.asarray(rank_overload(run), dtype=np.float64)
    crossing = cross_host_fraction(run)
    out["cross_host_frac"] = (crossing if crossing is not None
                              else np.full(out["max"].shape, np.nan))
    dropped = run.data.get("routing/dropped")
    out["drop_rate"] = (drop_fraction(dropped, run.data["routing/expert_load"], axis=2)
                        if dropped is not None else np.full(out["max"].shape, np.nan))
    return {name: out[name] for name in METRICS}


def drop_fraction(dropped, load, axis=None):
    """sum(dropped) / sum(load) over `axis` (all axes when None), 0 where the load sums to 0:
    the share of the selected assignments that the token capacity dropped."""
    dropped = np.asarray(dropped, dtype=np.float64).sum(axis=axis)
    load = np.asarray(load, dtype=np.float64).sum(axis=axis)
    share = np.divide(dropped, load, out=np.zeros_like(load), where=load > 0)
    return share if share.ndim else float(share)


def step_drop_rate(run):
    """[N] the overall drop rate of each step (dropped / selected assignments, all layers and
    experts), or None when the file has no drop counts."""
    dropped = run.data.get("routing/dropped")
    if dropped is None:
        return None
    return drop_fraction(dropped, run.data["routing/expert_load"], axis=(1, 2))


def capacity_on(run):
    """True when the run had a token capacity: its configuration says --capacity-factor > 0, or
    its file counts a dropped assignment."""
    dropped = run.data.get("routing/dropped")
    return bool((capacity_factor(run) or 0.0) > 0
                or (dropped is not None and np.any(dropped)))


def cross_layer_percentiles(values, layers, qs=(50, 75, 90, 95)):
    """{q: value}: percentiles over the layers `layers` of one per-layer value [L] (Megatron-LM
    issue #2398's cross-layer statistics); {} without layers."""
    picked = np.asarray(values, dtype=np.float64)[layers]
    if picked.size == 0:
        return {}
    return dict(zip(qs, np.percentile(picked, qs)))

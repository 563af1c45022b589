"""Small moe_rt statistics files (format "moe_rt.stats", version 1) for the tests of
scripts/moe_stats.py and the worked example of docs/analysis.md, following docs/hdf5-schema.md
(version 1: without the units, named axes and /config of version 2, so the tools are tested on
both, real runs giving version 2).

Two runs of one tiny model, steps 0..20: L=6 layers (2 hash, then 4 top-k), E=4 experts, K=2,
W=2 ranks (EP group 2: rank 0 owns experts 0-1, rank 1 owns 2-3), B=2 sequences of S=16 tokens
per rank, so T=64 tokens and T·K=128 assignments per layer per step, a mean load of 32.
Run A has the bias update off, run B on; both start from the same step-0 loads and their hash
layers have identical loads at every step. Loads at steps 0 and 20 are chosen so that the
variance table can be checked by hand (EXPECTED_VARIANCE below); other steps interpolate.

Shadow balancers (moe_rt --shadow): build_run(..., shadows=SHADOW_RULES) adds /shadow/RULE/
expert_load, max_violation and bias for each rule, loads whose deviations from the mean are the
step-0 deviations scaled by the rule's SHADOW_SCALE (0 in the hash layers, as moe_rt writes).

Token capacity (moe_rt --capacity-factor C): with_capacity(run, C) adds /routing/dropped, the
assignments over capacity_drops' per-step capacity, and the option's lines to the configuration
text; with_eval(run, ...) adds validation rows (/eval), with /eval/dropped unless told not to.

Runs of any shape (placement replay): build_loads_run(load, world) wraps expert loads [N, L, E] in
a complete run on W ranks holding the experts as moe_rt does by default (contiguous blocks, the
first E mod W ranks one more), so its /routing/rank_load and /routing/rank_overload agree with the
loads (or with the placement it is given, recorded in /layers/placement).

Resumed runs: rows_of cuts a run to some of its steps, with_world gives it another number of
ranks, write_segment writes such a cut as one file of a resumed run (root attributes
resumed_from, resumed_from_step).

Also a command line: `python3 stats_fixture.py example DIR` writes DIR/run_a.h5 and
DIR/run_b.h5; `python3 stats_fixture.py swmr-writer PATH ROWS` keeps a file open for SWMR writing
(used to test reading a file that is being written); `python3 stats_fixture.py killed-writer PATH
ROWS` writes the same in SWMR mode and kills itself (SIGKILL) with the file still open.
"""
import fcntl
import os
import signal
import struct
import sys

import h5py
import numpy as np

NUM_STEPS = 21
NUM_LAYERS, NUM_HASH, NUM_EXPERTS, TOP_K, WORLD = 6, 2, 4, 2, 2
VOCAB, SEQ_LEN, BATCH_PER_RANK = 64, 16, 2
TOKENS = WORLD * BATCH_PER_RANK * SEQ_LEN                      # T = 64
MEAN_LOAD = TOKENS * TOP_K // NUM_EXPERTS                      # 32
ENTROPY_FLOOR = 1.6316
BIAS_RATE = 0.001
# The file-format versions of HDF5 1.10, the oldest with SWMR: what the C++ writer gets from the
# system library, and readable by its h5dump (h5py may bundle a newer HDF5 whose "latest" is not).
LIBVER = ("v110", "v110")
PHASES = ("attention", "router", "dispatch", "experts", "combine", "backward", "optimizer",
          "allreduce")

# Per layer: deviation of the load from the mean at (step 0, step 20 in A, step 20 in B).
# Antisymmetric (d[e] = -d[E-1-e]), so every row sums to T·K even after rounding.
DEVIATIONS = {
    0: ([8, 4, -4, -8], [8, 4, -4, -8], [8, 4, -4, -8]),         # hash
    1: ([6, 2, -2, -6], [6, 2, -2, -6], [6, 2, -2, -6]),         # hash
    2: ([12, 4, -4, -12], [10, 6, -6, -10], [4, 2, -2, -4]),     # B much better
    3: ([2, 0, 0, -2], [0, 0, 0, 0], [0, 0, 0, 0]),              # A == B == 0
    4: ([3, 1, -1, -3], [0, 0, 0, 0], [1, 1, -1, -1]),           # A == 0 != B
    5: ([2, -2, 2, -2], [2, -2, 2, -2], [4, -4, 4, -4]),         # B worse
}
# Hand-computed: population variance of MEAN_LOAD + deviation, and (A - B)/A at step 20.
EXPECTED_VARIANCE = {
    0: (40.0, 40.0, 40.0, "0.00%"),
    1: (20.0, 20.0, 20.0, "0.00%"),
    2: (80.0, 68.0, 10.0, "85.29%"),
    3: (2.0, 0.0, 0.0, "0.00%"),
    4: (5.0, 0.0, 1.0, "n/a"),
    5: (4.0, 4.0, 16.0, "-300.00%"),
}
EXPECTED_TOTAL = (91.0, 72.0, 27.0, "62.50%")   # top-k layers 2..5 only

# Shadow balancers: rule -> (scale of the step-0 deviations at step n, bias update rate). Every
# shadow starts where the run starts (bias 0: the same loads at step 0); "none" drifts away from
# balance, "sign:0.001" is worst at step 6 and then settles, "proportional:0.01" closes in.
SHADOW_SCALE = {
    "none": (lambda n: 1.0 + 0.075 * n, 0.0),
    "proportional:0.01": (lambda n: 1.0 - 0.02 * n, 0.01),
    "sign:0.001": (lambda n: 1.0 + np.minimum(n, 6) / 12.0 - np.maximum(n - 6, 0) / 8.0, 0.001),
}
SHADOW_RULES = tuple(sorted(SHADOW_SCALE))


def routing_kinds():
    return ["hash"] * NUM_HASH + ["topk"] * (NUM_LAYERS - NUM_HASH)


def config_text(bias_rate):
    lines = ["# moe_rt configuration: re-read with --config FILE", "model = micro",
             f"steps = {NUM_STEPS}", "seed = 1234", f"batch-per-rank = {BATCH_PER_RANK}",
             f"seq-len = {SEQ_LEN}", f"layers = {NUM_LAYERS}", f"hash-layers = {NUM_HASH}",
             f"experts = {NUM_EXPERTS}", f"top-k = {TOP_K}", "score-func = sqrtsoftplus",
             "route-scale = 1.5", f"bias-update-rate = {bias_rate:g}",
             "seq-aux-loss-weight = 1e-04", "force-balance = none", "data = synthetic",
             "lr = 0.003", "warmup-steps = 10", "grad-clip = 1"]
    return "\n".join(lines) + "\n"


def expert_load(variant):
    """[N, L, E] int64: MEAN_LOAD + deviation, linear from step 0 to step 20, rounded."""
    column = 1 if variant == "A" else 2
    t = (np.arange(NUM_STEPS) / (NUM_STEPS - 1))[:, None, None]
    start = np.array([DEVIATIONS[l][0] for l in range(NUM_LAYERS)], dtype=np.float64)
    end = np.array([DEVIATIONS[l][column] for l in range(NUM_LAYERS)], dtype=np.float64)
    return (MEAN_LOAD + np.round(start + (end - start) * t)).astype(np.int64)


def bias_trajectory(load, rate):
    """[N, L, E] float32: the bias used at each step, updated after it (docs/load-balancing.md),
    top-k only."""
    bias = np.zeros(load.shape, dtype=np.float32)
    for n in range(1, load.shape[0]):
        step = rate * np.sign(load[n - 1].mean(axis=1, keepdims=True) - load[n - 1])
        step[:NUM_HASH] = 0.0
        bias[n] = bias[n - 1] + step.astype(np.float32)
    return bias


def shadow_series(rules):
    """/shadow/RULE/* datasets of each rule of SHADOW_SCALE: [N, L, E] int64 loads (0 in the hash
    layers), their [N, L] max violation (0 there) and the rule's [N, L, E] float32 bias."""
    start = np.array([DEVIATIONS[l][0] for l in range(NUM_LAYERS)], dtype=np.float64)
    n = np.arange(NUM_STEPS, dtype=np.float64)[:, None, None]
    datasets = {}
    for rule in rules:
        scale, rate = SHADOW_SCALE[rule]
        load = (MEAN_LOAD + np.round(start * scale(n))).astype(np.int64)
        load[:, :NUM_HASH] = 0
        lf = load.astype(np.float64)
        mean = lf.mean(axis=2)
        violation = np.divide(lf.max(axis=2) - mean, mean, out=np.zeros_like(mean),
                              where=mean > 0)
        datasets.update({f"shadow/{rule}/expert_load": load,
                         f"shadow/{rule}/max_violation": violation,
                         f"shadow/{rule}/bias": bias_trajectory(load, rate)})
    return datasets


def step_series(variant):
    s = np.arange(NUM_STEPS, dtype=np.float64)
    start = np.log(VOCAB)
    loss = ENTROPY_FLOOR + (start - ENTROPY_FLOOR) * np.exp(-s / (7.0 if variant == "A" else 7.2))
    tokens_per_s = np.where(s == 0, 7500.0, 150000.0 + 1000.0 * np.cos(s))
    lr = np.where(s < 10, 0.003 * (s + 1) / 10, 0.0015 * (1 + np.cos(np.pi * (s - 10) / 11)))
    return {"steps/step": np.arange(NUM_STEPS, dtype=np.int64), "steps/loss": loss,
            "steps/grad_norm": 0.3 + 1.2 * np.exp(-s / 10), "steps/lr": lr,
            "steps/tokens_per_s": tokens_per_s, "steps/step_time_s": TOKENS / tokens_per_s}


def routing_series(load, bias):
    lf = load.astype(np.float64)
    mean = lf.mean(axis=2)
    rank_load = lf.reshape(NUM_STEPS, NUM_LAYERS, WORLD, NUM_EXPERTS // WORLD).sum(axis=3)
    balance = 1e-4 * (1.0 + lf.std(axis=2) / mean)
    balance[:, :NUM_HASH] = 0.0
    return {"routing/expert_load": load, "routing/rank_load": rank_load.astype(np.int64),
            "routing/bias": bias, "routing/load_variance": lf.var(axis=2),
            "routing/max_violation": (lf.max(axis=2) - mean) / mean,
            "routing/load_cv": lf.std(axis=2) / mean,
            "routing/rank_overload": rank_load.max(axis=2) / rank_load.mean(axis=2),
            "routing/balance_loss": balance}


def phase_time(steps, world):
    """[N, W, phases] float64 seconds of the steps `steps`, slightly different per rank and step."""
    s = np.asarray(steps, dtype=np.float64)[:, None, None]
    return 1e-4 * (1 + np.arange(len(PHASES)))[None, None, :] * (
        1.0 + 0.01 * np.arange(world)[None, :, None] + 0.001 * np.cos(s))


def build_run(variant, shadows=()):
    """{'attrs': {...}, 'strings': {...}, 'datasets': {...}} of run "A" or "B"; with the shadow
    balancers `shadows` (rules of SHADOW_SCALE) when given."""
    rate = 0.0 if variant == "A" else BIAS_RATE
    load = expert_load(variant)
    datasets = {**step_series(variant), **routing_series(load, bias_trajectory(load, rate)),
                **shadow_series(shadows)}
    datasets["steps/balance_loss"] = datasets["routing/balance_loss"].sum(axis=1)
    datasets["perf/phase_time"] = phase_time(np.arange(NUM_STEPS), WORLD)
    rng = np.random.default_rng(7)
    hash_table = np.stack([[rng.permutation(NUM_EXPERTS)[:TOP_K] for _ in range(VOCAB)]
                           for _ in range(NUM_HASH)]).astype(np.int32)    # [L_h, V, K]
    attrs = {"format": "moe_rt.stats", "format_version": 1, "program_version": "moe_rt 0.1.0",
             "model": "micro", "world_size": WORLD, "ep_size": WORLD, "seed": 1234,
             "config": config_text(rate), "created": "2026-01-01T00:00:00Z",
             "data": "synthetic", "entropy_floor": ENTROPY_FLOOR, "num_layers": NUM_LAYERS,
             "num_experts": NUM_EXPERTS, "top_k": TOP_K, "vocab": VOCAB,
             "hash_layers": NUM_HASH, "seq_len": SEQ_LEN, "batch_per_rank": BATCH_PER_RANK}
    strings = {"layers/routing": routing_kinds(), "perf/phases": list(PHASES)}
    return {"attrs": attrs, "strings": strings, "datasets": datasets, "hash_table": hash_table}


TRACE_EVERY = 5


def build_traces(run, steps=None, unbiased=False):
    """/trace datasets of `run` (from build_run) at every TRACE_EVERY-th step: T = TOKENS tokens
    drawn from a skewed distribution (a few frequent ids), hash layers routed by the hash table,
    top-k layer l sending token v to experts (v + l + shift) % E and the next one, where
    shift = 1 from step 10 on: every token id's top-k set changes once, between steps 5 and 10.
    With `unbiased`, also /trace/experts_unbiased: the shift-free choice, so the two agree in
    the top-k layers up to step 5 and never from step 10 on."""
    steps = np.arange(0, NUM_STEPS, TRACE_EVERY) if steps is None else np.asarray(steps)
    rng = np.random.default_rng(11)
    weights = 1.0 / np.arange(1, VOCAB + 1) ** 1.2
    token_id = np.stack([rng.choice(VOCAB, size=TOKENS, p=weights / weights.sum())
                         for _ in steps]).astype(np.int32)                     # [M, T]
    experts = np.zeros((len(steps), NUM_LAYERS, TOKENS, TOP_K), dtype=np.int32)
    for m, step in enumerate(steps):
        for layer in range(NUM_LAYERS):
            if layer < NUM_HASH:
                experts[m, layer] = run["hash_table"][layer][token_id[m]]
            else:
                first = (token_id[m] + layer + (step >= 10)) % NUM_EXPERTS
                experts[m, layer] = np.stack([first, (first + 1) % NUM_EXPERTS], axis=1)
    g = np.arange(TOKENS)
    extra = {}
    if unbiased:
        free = experts.copy()
        for m, step in enumerate(steps):
            for layer in range(NUM_HASH, NUM_LAYERS):
                first = (token_id[m] + layer) % NUM_EXPERTS
                free[m, layer] = np.stack([first, (first + 1) % NUM_EXPERTS], axis=1)
        extra["trace/experts_unbiased"] = free
    return {**extra, "trace/step": steps.astype(np.int64), "trace/token_id": token_id,
            "trace/position": np.tile(g % SEQ_LEN, (len(steps), 1)).astype(np.int32),
            "trace/rank": np.tile(g // (BATCH_PER_RANK * SEQ_LEN),
                                  (len(steps), 1)).astype(np.int32),
            "trace/experts": experts,
            "trace/weights": np.full(experts.shape, 1.0 / TOP_K, dtype=np.float32)}


NUM_SEQUENCES = WORLD * BATCH_PER_RANK                          # 4 sequences of S tokens a step


def capacity_drops(load, capacity_factor):
    """[..., E] int64 assignments dropped from `load` [..., E] by a token capacity: an expert takes
    at most ceil(C·S·K/E) assignments of each sequence, and the fixture's load is taken as spread
    evenly over the NUM_SEQUENCES sequences, so an expert keeps at most NUM_SEQUENCES times that
    (C = 1: 4 x 8 = 32, the mean load) and drops the rest."""
    per_sequence = int(np.ceil(capacity_factor * SEQ_LEN * TOP_K / NUM_EXPERTS))
    return np.maximum(load - NUM_SEQUENCES * per_sequence, 0).astype(np.int64)


def with_capacity(run, capacity_factor=1.0, drop_policy="probs", dropped=None):
    """`run` (from build_run) with a token capacity: /routing/dropped (`dropped`, default
    capacity_drops of its loads; /routing/expert_load keeps the loads before drops) and the lines
    capacity-factor and drop-policy in its configuration text."""
    load = run["datasets"]["routing/expert_load"]
    dropped = capacity_drops(load, capacity_factor) if dropped is None else dropped
    config = (run["attrs"]["config"] + f"capacity-factor = {capacity_factor:g}\n"
              f"drop-policy = {drop_policy}\n")
    return {**run, "attrs": {**run["attrs"], "config": config},
            "datasets": {**run["datasets"], "routing/dropped": np.asarray(dropped, np.int64)}}


def with_eval(run, every=5, capacity_factor=1.0, dropped=True):
    """`run` with validation rows after every `every`-th step: the loads of the step they follow
    with their deviations from the mean halved towards 0 (other tokens, other loads; rows still
    sum to T·K), their max violation and variance, and /eval/dropped (capacity_drops of them under
    `capacity_factor`) unless dropped is False."""
    steps = run["datasets"]["steps/step"]
    rows = np.nonzero(steps % every == 0)[0]
    deviation = run["datasets"]["routing/expert_load"][rows] - MEAN_LOAD
    load = MEAN_LOAD + np.trunc(deviation / 2).astype(np.int64)   # odd: pairs ±d still cancel
    lf = load.astype(np.float64)
    mean = lf.mean(axis=2)
    evals = {"eval/step": steps[rows].astype(np.int64),
             "eval/loss": run["datasets"]["steps/loss"][rows] + 0.05,
             "eval/time_s": np.full(len(rows), 0.01), "eval/tokens": np.full(len(rows), TOKENS),
             "eval/expert_load": load, "eval/load_variance": lf.var(axis=2),
             "eval/max_violation": (lf.max(axis=2) - mean) / mean}
    if dropped:
        evals["eval/dropped"] = capacity_drops(load, capacity_factor)
    return {**run, "eval": evals}


def rows_of(run, start, stop):
    """`run` (from build_run) cut to its rows [start, stop) (its steps start .. stop - 1), and its
    validation rows (with_eval) to those after these steps."""
    cut = {**run, "datasets": {name: data[start:stop] for name, data in run["datasets"].items()}}
    if "eval" in run:
        keep = (run["eval"]["eval/step"] >= start) & (run["eval"]["eval/step"] < stop)
        cut["eval"] = {name: data[keep] for name, data in run["eval"].items()}
    return cut


def with_world(run, world):
    """`run` on `world` ranks: /routing/rank_load, /routing/rank_overload and /perf/phase_time
    recomputed from the same expert loads. world <= E: each rank owns E/world experts; world > E:
    each expert's load is split over world/E replicas (rank r holds expert r % E)."""
    load = run["datasets"]["routing/expert_load"]                          # [N, L, E]
    n = load.shape[0]
    if world <= NUM_EXPERTS:
        rank_load = load.reshape(n, NUM_LAYERS, world, NUM_EXPERTS // world).sum(axis=3)
    else:
        copies = world // NUM_EXPERTS
        replica = np.arange(world) // NUM_EXPERTS                          # [W]
        expert = load[:, :, np.arange(world) % NUM_EXPERTS]                 # [N, L, W]
        rank_load = expert // copies + (replica < expert % copies)
    datasets = dict(run["datasets"])
    datasets["routing/rank_load"] = rank_load.astype(np.int64)
    datasets["routing/rank_overload"] = rank_load.max(axis=2) / rank_load.mean(axis=2)
    datasets["perf/phase_time"] = phase_time(run["datasets"]["steps/step"], world)
    attrs = {**run["attrs"], "world_size": world, "ep_size": min(world, NUM_EXPERTS)}
    return {**run, "attrs": attrs, "datasets": datasets}


def contiguous_rank_load(load, world):
    """[N, L, W] int64: loads [N, L, E] summed over each rank's experts under moe_rt's default
    layout: rank q owns E//W experts from q·(E//W) + min(q, E mod W), the first E mod W ranks
    one more."""
    experts = load.shape[2]
    base, extra = divmod(experts, world)
    bounds = [q * base + min(q, extra) for q in range(world + 1)]
    return np.stack([load[:, :, bounds[q]:bounds[q + 1]].sum(axis=2) for q in range(world)],
                    axis=2).astype(np.int64)


def build_loads_run(load, world, hash_layers=0, config=None, model="custom", placement=None):
    """A run (as build_run gives) of expert loads `load` [N, L, E] int64 at steps 0..N-1, on
    `world` ranks forming one EP group with the default contiguous layout (so rank_load and
    rank_overload follow from the loads), its first `hash_layers` layers hash-routed and the rest
    top-k, and the configuration lines `config` ({key: value}) added to its text. placement:
    [L][world] lists of expert ids (no replicas) the run used instead, recorded in
    /layers/placement as moe_rt does, rank_load following it."""
    load = np.asarray(load, dtype=np.int64)
    steps, layers, experts = load.shape
    s = np.arange(steps, dtype=np.float64)
    lf = load.astype(np.float64)
    mean = np.maximum(lf.mean(axis=2), 1e-12)
    fixed = {}
    if placement is None:
        rank_load = contiguous_rank_load(load, world)
    else:
        held = np.zeros((layers, world, experts), dtype=np.uint8)           # [L, P, E]
        for l, ranks in enumerate(placement):
            for q, ids in enumerate(ranks):
                held[l, q, ids] = 1
        rank_load = np.einsum("lqe,nle->nlq", held.astype(np.int64), load)
        fixed["layers/placement"] = held
    rank_mean = rank_load.mean(axis=2)
    lines = [f"model = {model}", f"layers = {layers}", f"hash-layers = {hash_layers}",
             f"experts = {experts}", f"top-k = {TOP_K}"]
    lines += [f"{key} = {value}" for key, value in (config or {}).items()]
    datasets = {
        "steps/step": np.arange(steps, dtype=np.int64), "steps/loss": 4.0 - 0.01 * s,
        "steps/balance_loss": np.zeros(steps), "steps/grad_norm": np.ones(steps),
        "steps/lr": np.full(steps, 0.003), "steps/tokens_per_s": np.full(steps, 1e5),
        "routing/expert_load": load, "routing/rank_load": rank_load,
        "routing/bias": np.zeros(load.shape, dtype=np.float32),
        "routing/load_variance": lf.var(axis=2),
        "routing/max_violation": (lf.max(axis=2) - mean) / mean,
        "routing/rank_overload": np.divide(rank_load.max(axis=2), rank_mean,
                                           out=np.ones(rank_mean.shape), where=rank_mean > 0)}
    attrs = {"format": "moe_rt.stats", "format_version": 1, "program_version": "moe_rt 0.1.0",
             "model": model, "world_size": world, "ep_size": world, "seed": 1,
             "config": "\n".join(lines) + "\n", "created": "2026-01-01T00:00:00Z",
             "data": "synthetic", "entropy_floor": float("nan"), "num_layers": layers,
             "num_experts": experts, "top_k": TOP_K, "vocab": VOCAB,
             "hash_layers": hash_layers, "seq_len": SEQ_LEN, "batch_per_rank": BATCH_PER_RANK}
    routing = ["hash"] * hash_layers + ["topk"] * (layers - hash_layers)
    hash_table = np.zeros((hash_layers, VOCAB, TOP_K), dtype=np.int32)
    return {"attrs": attrs, "strings": {"layers/routing": routing}, "datasets": datasets,
            "hash_table": hash_table, "fixed": fixed}


def resume_attrs(predecessor, step):
    """Root attributes of a file resumed from `predecessor` at the checkpoint of step `step`."""
    return {"resumed_from": os.path.abspath(predecessor), "resumed_from_step": np.int64(step)}


def write_segment(path, run, start, stop, predecessor=None, step=None, **kwargs):
    """Rows [start, stop) of `run` as one file of a resumed run: resumed from the file
    `predecessor` at step `step` when given (default start - 1). Returns path."""
    attrs = dict(kwargs.pop("attrs", None) or {})
    if predecessor is not None:
        attrs.update(resume_attrs(predecessor, start - 1 if step is None else step))
    return write_stats(path, rows_of(run, start, stop), attrs=attrs, **kwargs)


def as_attr(value, bytes_strings):
    if isinstance(value, str) and bytes_strings:
        return np.bytes_(value.encode())
    return value


def write_string_dataset(f, name, values, bytes_strings):
    if bytes_strings:  # fixed-length ASCII, read back as numpy.bytes_
        f.create_dataset(name, data=np.array([v.encode() for v in values], dtype="S"))
    else:              # variable-length UTF-8, read back as bytes by h5py 3
        f.create_dataset(name, data=values, dtype=h5py.string_dtype())


def write_row_dataset(f, name, data, rows):
    """Chunked, extendible, compressed, like the C++ writer; `rows` rows of `data` written."""
    f.create_dataset(name, data=data[:rows], maxshape=(None,) + data.shape[1:],
                     chunks=(max(1, min(rows, 64)),) + data.shape[1:], compression="gzip")


def write_stats(path, run, *, libver=LIBVER, bytes_strings=False, rows=None, lengths=None,
                drop=(), attrs=None, traces=None):
    """Writes `run` (from build_run) to path. rows: rows of every per-step dataset (default all);
    lengths: {dataset: rows} for individual datasets (a writer caught mid-step); drop: datasets
    or attributes to leave out; attrs: attribute overrides; traces: /trace datasets (from
    build_traces) to write."""
    rows = len(run["datasets"]["steps/step"]) if rows is None else rows
    lengths = lengths or {}
    with h5py.File(path, "w", libver=libver) as f:
        for key, value in {**run["attrs"], **(attrs or {})}.items():
            if key not in drop:
                f.attrs[key] = as_attr(value, bytes_strings)
        for name, values in run["strings"].items():
            write_string_dataset(f, name, values, bytes_strings)
        f.create_dataset("layers/hash_table", data=run["hash_table"])
        for name, data in run.get("fixed", {}).items():    # fixed-size datasets, e.g. placement
            if name not in drop:
                f.create_dataset(name, data=data)
        for name, data in run["datasets"].items():
            if name not in drop:
                write_row_dataset(f, name, data, lengths.get(name, rows))
        for name, data in run.get("eval", {}).items():
            if name not in drop:
                write_row_dataset(f, name, data, len(data))
        for rule, group in (f["shadow"].items() if "shadow" in f else ()):
            group.attrs["rule"] = rule          # as moe_rt writes: the group's name, its rule
        for name, data in (traces or {}).items():
            write_row_dataset(f, name, data, len(data))
    return path


def write_example(folder):
    """run_a.h5 (variable-length strings) and run_b.h5 (fixed-length byte strings)."""
    a = write_stats(f"{folder}/run_a.h5", build_run("A"))
    b = write_stats(f"{folder}/run_b.h5", build_run("B"), bytes_strings=True)
    return a, b


def ofd_lock(path):
    """A descriptor of `path` holding an open-file-description write lock on the whole file, as
    moe_rt's writer holds on its statistics file (io/file_lock.hpp)."""
    fd = os.open(path, os.O_RDWR)
    fcntl.fcntl(fd, getattr(fcntl, "F_OFD_SETLK", 37),
                struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    return fd


def swmr_writer(path, rows, kill=False):
    """Appends `rows` complete rows in SWMR mode, then one row of /steps/* only, then waits for
    a line on stdin before closing: a reader meanwhile must see exactly `rows` steps. Holds the
    file's lock like moe_rt's writer. kill: the process kills itself (SIGKILL) instead, leaving
    the file flagged as open for SWMR writing, and no lock."""
    run = build_run("A")
    with h5py.File(path, "w", libver=LIBVER) as f:
        lock = ofd_lock(path)
        for key, value in run["attrs"].items():
            f.attrs[key] = value
        for name, values in run["strings"].items():
            write_string_dataset(f, name, values, False)
        for name, data in run["datasets"].items():
            write_row_dataset(f, name, data, 0)
        f.swmr_mode = True
        for n in range(rows + 1):
            for name, data in run["datasets"].items():
                if n < rows or name.startswith("steps/"):
                    f[name].resize(n + 1, axis=0)
                    f[name][n] = data[n]
            f.flush()
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)
        print("ready", flush=True)
        sys.stdin.readline()
    os.close(lock)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "example":
        print("\n".join(write_example(sys.argv[2])))
    elif len(sys.argv) == 4 and sys.argv[1] == "swmr-writer":
        swmr_writer(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "killed-writer":
        swmr_writer(sys.argv[2], int(sys.argv[3]), kill=True)
    else:
        sys.exit("usage: stats_fixture.py example DIR | swmr-writer PATH ROWS | "
                 "killed-writer PATH ROWS")

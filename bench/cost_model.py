#!/usr/bin/env python3
"""A model of one moe_rt training step's time, from quantities moe_rt measures.

    python3 bench/cost_model.py check CALIBRATION.log RUN.log [RUN.log ...]
    python3 bench/cost_model.py predict CALIBRATION_TINY.log CALIBRATION_FINE.log
    python3 bench/cost_model.py placement CALIBRATION.log RUN.h5 [--window N] [--gbit G]

CALIBRATION.log is the output of a one-rank, one-thread moe_rt run (bench/cost_model.sh writes
them): its phase table gives each phase's time per token on one core, its header the parameter
counts. RUN.log is the output of a run of the same model with one thread per rank at any rank
count; the model is evaluated for that run's layout and set beside the measured phases.

The model (docs/performance.md, "A cost model for scale", states every assumption):

  step = compute + waiting + exchange + allreduce

  compute    Σ over the compute phases of (time per token on one core) × N tokens per rank, the
             optimizer per parameter the rank holds (replicated + its local experts), the expert
             phases times the load factor f (the busiest rank's rows over the mean; 1 = balanced),
             the router's times E / E_calibration; besides, the exchange phases' local work and
             the all-reduce's (at one rank, the whole of both phases: a rank that is its whole EP
             group exchanges no rows, its experts copy theirs in place, so its exchange phases
             hold the combine's weighted sum and the scatter of the input gradients, and the row
             copies fall in its expert phases)
  waiting    with R ranks × t threads on c cores of one host, (R·t/c − 1) × compute when R·t > c:
             ranks take turns on a core, and a rank waits at the next exchange while the others
             run (what the 8-rank default shows on 2 cores); compute includes the copies and the
             local all-reduce work here
  exchange   4 exchanges per MoE layer and step (dispatch, combine, both backward), each
             messages × α + bytes / β, with the bytes each rank sends (N·K·D·4 · (P−1)/P), split
             between its host (shared memory) and the link to other hosts, whose bandwidth the
             R ranks of a host share
  allreduce  the dense gradients' tree reduction and broadcast: 2·⌈log2 W⌉ hops of the
             replicated parameters (4 bytes each), the hops between hosts at the link's rate, plus
             the expert gradients' reduction over the W/P replicas when W > P, plus with R
             redundant experts their gradients' exchange between the copies (each copy's
             3·D·F·L values to the other, about 2·R/W expert gradients a rank, across the link)

`placement` carries a placement's predicted imbalance to scale: for each W of 8–256 ranks up to
E (8 a host), `moe_stats.py placement` replays the policies on RUN.h5's recorded loads at P = W, and the
max/mean rank load it predicts is the model's load factor f.
"""
import csv
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

COMPUTE_PHASES = ("attention", "router", "experts", "attention_bwd", "router_bwd", "experts_bwd",
                  "other", "stats")
EXPERT_PHASES = ("experts", "experts_bwd")
EXCHANGE_PHASES = ("dispatch", "combine", "dispatch_bwd", "combine_bwd")

# Shared memory between the ranks of one host (Open MPI's vader BTL), from bench_alltoall at 2
# ranks on the development machine: about 5 µs per message and 6 GB/s per rank.
SHM_LATENCY_S = 5e-6
SHM_BYTES_PER_S = 6e9
# An exchange that crosses hosts waits for about two round trips of the link (docs/cluster.md:
# 200 µs of one-way delay added 0.76 ms to each exchange).
LINK_TRIPS = 4
# The predictions' links: RDMA-class (UCX over InfiniBand or RoCE), 2 µs one way and 2 µs of the
# sender's time per message.
PREDICT_LATENCY_S = 2e-6
PREDICT_PER_MESSAGE_S = 2e-6


@dataclass
class Run:
    """What one moe_rt log says: layout, model, parameters and the phase table (ms)."""
    path: str
    ranks: int = 1
    ep: int = 1
    hosts: int = 1
    threads: int = 1
    config: dict = field(default_factory=dict)
    replicated: int = 0
    in_experts: int = 0
    phases: dict = field(default_factory=dict)
    step_ms: float = 0.0
    tokens_per_s: float = 0.0

    def model(self, key):
        return int(float(self.config[key]))

    @property
    def tokens_per_rank(self):
        return self.model("batch-per-rank") * self.model("seq-len")


def read_run(path):
    text = open(path).read()

    def grab(pattern, cast=float):
        m = re.search(pattern, text, re.M)
        if not m:
            sys.exit(f"cost_model.py: '{pattern}' not found in {path} (a moe_rt log?)")
        return cast(m.group(1))

    run = Run(path)
    run.ranks = grab(r"on (\d+) ranks", int)
    run.ep = grab(r"\(EP group (\d+),", int)
    run.threads = grab(r"(\d+) thread\(s\) per rank", int)
    run.hosts = grab(r"ranks: \d+ on (\d+) host", int)
    for m in re.finditer(r"^  ([a-z][a-z0-9-]+) {2,}(\S+)$", text, re.M):
        run.config.setdefault(m.group(1), m.group(2))
    run.replicated = grab(r"parameters: (\d+) replicated", int)
    run.in_experts = grab(r"replicated \+ (\d+) in experts", int)
    for m in re.finditer(r"^  (\w+)\s+([0-9.]+)\s+[0-9.]+\s+[0-9.]+%", text, re.M):
        run.phases[m.group(1)] = float(m.group(2))
    run.step_ms = grab(r"^  step\s+([0-9.]+)")
    run.tokens_per_s = grab(r"median (\d+) tokens/s")
    return run


@dataclass
class Link:
    """Between hosts: the host's link in bytes per second, its one-way delay, and the sending
    rank's own cost per message (the transport's system calls and copies)."""
    bytes_per_s: float
    latency_s: float
    per_message_s: float


def parse_link(text):
    """GBITS/DELAY_US[/MESSAGE_US], e.g. 25/20 or 100/5/2."""
    parts = [float(x) for x in text.split("/")]
    if len(parts) not in (2, 3):
        sys.exit(f"cost_model.py: --link {text}: expected GBITS/DELAY_US[/MESSAGE_US]")
    return Link(parts[0] * 1e9 / 8, parts[1] * 1e-6, (parts[2] if len(parts) == 3 else 30) * 1e-6)


@dataclass
class Layout:
    ranks: int          # W
    ep: int             # P
    ranks_per_host: int  # R
    cores_per_host: int  # c
    threads: int = 1    # t
    tokens_per_rank: int = 256
    load_factor: float = 1.0  # the busiest rank's expert rows over the mean
    redundant: int = 0        # R replicated expert instances beyond the E experts

    @property
    def hosts(self):
        return max(1, self.ranks // self.ranks_per_host)


@dataclass
class Calibration:
    """Per-token times (s) of one rank on one core, and the per-parameter optimizer time."""
    per_token: dict
    exchange_copy_per_token: float  # the exchange's own copies at one rank (no transfer)
    optimizer_per_param: float
    allreduce_local: float  # per replicated parameter: the norm's sums at one rank
    experts: int  # E of the calibration run: the router's phases scale with E / experts


ROUTER_PHASES = ("router", "router_bwd")


def calibrate(run):
    if run.ranks != 1 or run.threads != 1:
        sys.exit(f"cost_model.py: the calibration run {run.path} has {run.ranks} rank(s) of "
                 f"{run.threads} thread(s), needs 1 of 1")
    n = run.tokens_per_rank
    return Calibration(
        per_token={p: run.phases.get(p, 0.0) * 1e-3 / n for p in COMPUTE_PHASES},
        exchange_copy_per_token=sum(run.phases.get(p, 0.0) for p in EXCHANGE_PHASES) * 1e-3 / n,
        optimizer_per_param=run.phases.get("optimizer", 0.0) * 1e-3 /
        (run.replicated + run.in_experts),
        allreduce_local=run.phases.get("allreduce", 0.0) * 1e-3 / run.replicated,
        experts=run.model("experts"),
    )


@dataclass
class Model:
    """The model's shape as the step's traffic sees it."""
    layers: int
    top_k: int
    d_model: int
    experts: int
    replicated: int      # parameters every rank holds
    expert_params: int   # parameters of all experts together


def model_of(run):
    return Model(layers=run.model("layers"), top_k=run.model("top-k"),
                 d_model=run.model("d-model"), experts=run.model("experts"),
                 replicated=run.replicated, expert_params=run.in_experts)


def with_experts(base, experts):
    """`base` with E experts: the experts' parameters scale with E, and so do the routers' D·E
    weights in every layer, which every rank holds."""
    per_expert = base.expert_params // base.experts
    replicated = base.replicated + base.layers * base.d_model * (experts - base.experts)
    return Model(layers=base.layers, top_k=base.top_k, d_model=base.d_model, experts=experts,
                 replicated=replicated, expert_params=per_expert * experts)


def hop_time(nbytes, crosses, link):
    if crosses:
        return 2 * link.latency_s + link.per_message_s + nbytes / link.bytes_per_s
    return SHM_LATENCY_S + nbytes / SHM_BYTES_PER_S


def predict(cal, model, lay, link, hierarchical=False):
    """The step's parts in seconds: compute (the compute phases and the optimizer), copies (the
    exchange's own), waiting, exchange (the transfers), allreduce (the transfers and the local
    work). `hierarchical`: an exchange moe_rt does not have, in two levels (rows for another host
    go in one message per host pair, gathered and scattered within the hosts by shared memory)."""
    n = lay.tokens_per_rank
    compute = 0.0
    for p, t in cal.per_token.items():
        scale = lay.load_factor if p in EXPERT_PHASES else 1.0
        if p in ROUTER_PHASES:
            scale = model.experts / cal.experts
        compute += t * n * scale
    local_experts = (model.expert_params * max(1, (model.experts + lay.redundant) // lay.ep) /
                     model.experts)
    compute += cal.optimizer_per_param * (model.replicated + local_experts)
    copies = cal.exchange_copy_per_token * n
    allreduce_local = cal.allreduce_local * model.replicated
    share = lay.ranks_per_host * lay.threads / lay.cores_per_host
    waiting = max(0.0, min(share, lay.ranks) - 1.0) * (compute + copies + allreduce_local)

    # The exchange: every rank sends N·K rows, (P−1)/P of them to other ranks of its EP group.
    # The EP group is P consecutive ranks; those on the same host travel by shared memory.
    P, R = lay.ep, lay.ranks_per_host
    row_bytes = model.d_model * 4
    rows_out = n * model.top_k * (P - 1) / P * lay.load_factor
    same_host = min(P, R) - 1            # peers of the group on this rank's host
    other_hosts = (P - 1) - same_host    # peers across the link
    exchange = 0.0
    if P > 1:
        bytes_local = rows_out * row_bytes * same_host / (P - 1)
        bytes_remote = rows_out * row_bytes * other_hosts / (P - 1)
        # The host's R ranks share its link: R·bytes_remote leave (and arrive) per exchange.
        t_local = same_host * SHM_LATENCY_S + bytes_local / SHM_BYTES_PER_S
        t_remote = 0.0
        if other_hosts > 0:
            messages = other_hosts
            if hierarchical:  # each rank of a host carries 1/R of the host pairs
                messages = math.ceil((P // min(R, P) - 1) / min(R, P))
                t_local += 2 * bytes_remote / SHM_BYTES_PER_S  # the gather and the scatter
            t_remote = (LINK_TRIPS * link.latency_s + messages * link.per_message_s +
                        min(R, P) * bytes_remote / link.bytes_per_s)
        per_exchange = max(t_local, t_remote) + SHM_LATENCY_S  # + the count exchange
        exchange = 4 * model.layers * per_exchange

    # The all-reduce: a tree over W ranks (reduce, then broadcast), the top ⌈log2 H⌉ levels
    # between hosts; then the experts' reduction over the W/P replicas.
    allreduce = 0.0
    depth = math.ceil(math.log2(lay.ranks)) if lay.ranks > 1 else 0
    cross_levels = math.ceil(math.log2(lay.hosts)) if lay.hosts > 1 else 0
    dense_bytes = model.replicated * 4
    for level in range(depth):
        crosses = level >= depth - cross_levels
        allreduce += 2 * hop_time(dense_bytes, crosses, link)
    replicas = lay.ranks // P
    if replicas > 1:
        rep_bytes = local_experts * 4
        rep_depth = math.ceil(math.log2(replicas))
        # Replicas of one shard lie P ranks apart: on other hosts once P >= R.
        for _ in range(rep_depth):
            allreduce += 2 * hop_time(rep_bytes, P >= R, link)
    if lay.redundant > 0:
        # Each copy of a replicated expert sends its gradient to the other (runtime/run/
        # expert_instances.cpp): about 2·R/W expert gradients leave each rank, over the link.
        per_expert_bytes = 4 * model.expert_params / model.experts
        allreduce += hop_time(2 * lay.redundant / lay.ranks * per_expert_bytes, lay.hosts > 1,
                              link)
    return {"compute": compute, "copies": copies, "waiting": waiting, "exchange": exchange,
            "allreduce": allreduce + allreduce_local}


def measured_parts(run):
    ph = run.phases
    compute = sum(ph.get(p, 0.0) for p in COMPUTE_PHASES) + ph.get("optimizer", 0.0)
    exchange = sum(ph.get(p, 0.0) for p in EXCHANGE_PHASES)
    return {"compute": compute * 1e-3, "exchange+waiting": exchange * 1e-3,
            "allreduce": ph.get("allreduce", 0.0) * 1e-3, "step": run.step_ms * 1e-3}


def cmd_check(args):
    if len(args) < 2:
        sys.exit("usage: cost_model.py check CALIBRATION.log RUN.log [RUN.log ...] "
                 "[--cores C] [--link GBITS/DELAY_US[/MESSAGE_US]]")
    cores, link = 2, parse_link("25/20")
    files = []
    i = 0
    while i < len(args):
        if args[i] == "--cores":
            cores = int(args[i + 1])
            i += 2
        elif args[i] == "--link":
            link = parse_link(args[i + 1])
            i += 2
        else:
            files.append(args[i])
            i += 1
    cal_run = read_run(files[0])
    cal = calibrate(cal_run)
    print(f"# calibration: {files[0]} (1 rank, 1 thread, {cal_run.tokens_per_rank} tokens)")
    print("# run | ranks | P | hosts | part | measured ms | model ms | model / measured")
    for path in files[1:]:
        run = read_run(path)
        if run.threads != 1:
            sys.exit(f"cost_model.py: {path} ran {run.threads} threads per rank; the model "
                     "takes one (moe_rt --threads 1)")
        lay = Layout(ranks=run.ranks, ep=run.ep, ranks_per_host=run.ranks // run.hosts,
                     cores_per_host=cores, threads=1, tokens_per_rank=run.tokens_per_rank)
        parts = predict(cal, model_of(run), lay, link)
        model = {"compute": parts["compute"],
                 "exchange+waiting": parts["copies"] + parts["waiting"] + parts["exchange"],
                 "allreduce": parts["allreduce"], "step": sum(parts.values())}
        meas = measured_parts(run)
        for part in ("compute", "exchange+waiting", "allreduce", "step"):
            ratio = model[part] / meas[part] if meas[part] > 0 else float("nan")
            print(f"{path} | {run.ranks} | {run.ep} | {run.hosts} | {part} | "
                  f"{meas[part] * 1e3:.1f} | {model[part] * 1e3:.1f} | {ratio:.2f}")


def cmd_predict(args):
    if len(args) != 2:
        sys.exit("usage: cost_model.py predict CALIBRATION_TINY.log CALIBRATION_FINE.log")
    print("# one rank per core, 8 ranks per host, 1 sequence of 256 tokens per rank; EP P =")
    print("# min(W, E) with E scaled to keep the experts per rank of 8 ranks (tiny: 1, fine: 8)")
    print("# the routers' D·E weights grow with E (replicated: the all-reduce and the optimizer),")
    print("# the router's time per token with E")
    print("# preset | W=P | E | Gbit/s | step ms | compute | exchange | allreduce | tokens/s/rank "
          "| exchange share | step ms, two-level exchange")
    for path, per_rank in zip(args, (1, 8)):
        run = read_run(path)
        cal = calibrate(run)
        base = model_of(run)
        for W in (16, 64, 256):
            model = with_experts(base, W * per_rank)
            for gbit in (25, 100, 400):
                link = Link(gbit * 1e9 / 8, PREDICT_LATENCY_S, PREDICT_PER_MESSAGE_S)
                lay = Layout(ranks=W, ep=W, ranks_per_host=8, cores_per_host=8,
                             tokens_per_rank=256)
                parts = predict(cal, model, lay, link)
                step = sum(parts.values())
                two_level = sum(predict(cal, model, lay, link, hierarchical=True).values())
                compute = parts["compute"] + parts["copies"]
                print(f"{run.config['model']} | {W} | {model.experts} | {gbit} | "
                      f"{step * 1e3:.1f} | {compute * 1e3:.1f} | {parts['exchange'] * 1e3:.1f} | "
                      f"{parts['allreduce'] * 1e3:.1f} | {256 / step:.0f} | "
                      f"{parts['exchange'] / step:.0%} | {two_level * 1e3:.1f}")


def replay_load_factor(stats, ranks, hosts, redundant, policy, window):
    """The replay's mean max/mean rank load of `policy` over the scored steps, all layers."""
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, os.path.join(here, "..", "scripts", "moe_stats.py"), "placement", stats,
           "--ranks", str(ranks), "--hosts", str(hosts), "--redundant", str(redundant),
           "--window", str(window), "--policies", policy, "--csv"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"cost_model.py: {' '.join(cmd)}: {proc.stderr.strip()}")
    rows = [r for r in csv.DictReader(proc.stdout.splitlines())
            if r["policy"] == policy and r["layers"].isdigit()]  # per layer, not the summaries
    return sum(float(r["mean_overload"]) for r in rows) / len(rows)


def cmd_placement(args):
    usage = "usage: cost_model.py placement CALIBRATION.log RUN.h5 [--window N] [--gbit G]"
    if len(args) < 2:
        sys.exit(usage)
    window, gbit = 20, 100
    rest = args[2:]
    while rest:
        if len(rest) < 2 or rest[0] not in ("--window", "--gbit"):
            sys.exit(usage)
        window, gbit = (int(rest[1]), gbit) if rest[0] == "--window" else (window, float(rest[1]))
        rest = rest[2:]
    run = read_run(args[0])
    cal, model = calibrate(run), model_of(run)
    link = Link(gbit * 1e9 / 8, PREDICT_LATENCY_S, PREDICT_PER_MESSAGE_S)
    print(f"# {run.config['model']}: E = {model.experts}, one rank per core, 8 ranks per host, "
          f"256 tokens per rank, {gbit:g} Gbit/s; the load factor f is the replay's max/mean rank")
    print(f"# load on {args[1]}'s loads (placed from {window} steps, scored on the rest), mean "
          f"over layers")
    print("# W=P | policy | R | f | step ms | expert phases ms | speed-up over contiguous")
    for W in (8, 16, 32, 64, 128, 256):
        if W > model.experts:
            continue
        base_ms = None
        for policy, R in (("contiguous", 0), ("greedy", 0), ("hierarchical", 0),
                          ("greedy", W // 4), ("hierarchical", W // 4)):
            f = replay_load_factor(args[1], W, max(1, W // 8), R, policy, window)
            lay = Layout(ranks=W, ep=W, ranks_per_host=8, cores_per_host=8, tokens_per_rank=256,
                         load_factor=f, redundant=R)
            step = sum(predict(cal, model, lay, link).values()) * 1e3
            experts = sum(cal.per_token[p] for p in EXPERT_PHASES) * 256 * f * 1e3
            base_ms = step if base_ms is None else base_ms
            print(f"{W} | {policy} | {R} | {f:.3f} | {step:.1f} | {experts:.1f} | "
                  f"{base_ms / step:.3f}")


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("check", "predict", "placement"):
        sys.exit(__doc__)
    {"check": cmd_check, "predict": cmd_predict,
     "placement": cmd_placement}[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()

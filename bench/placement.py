#!/usr/bin/env python3
"""Expert placement, predicted and measured: does the replay's prediction hold?

    bench/placement.py [--binary build/moe_rt] [--steps 60] [--window 10] [--rounds 3]
                       [--out runs/placement]

At one rank per core (2 ranks here, 4 experts each), for two workloads that balance badly:

    forced    --force-balance zipf:1.2 (expert e drawn with weight (e+1)^-1.2: stationary loads)
    natural   --bias-update-rate 0 --seq-aux-loss-weight 0 (no balancing: the routing collapses)

1. a recording run in the contiguous layout; 2. `moe_stats.py placement` on its loads writes the
greedy and hierarchical placements with 0 and 2 redundant slots (from the first --window steps);
3. moe_rt runs each placement (rounds interleaved, so drift hits every placement alike), and each
run's file gives, over the steps after the window:

    predicted   the replay's max/mean rank load of the placement the run ran under (its
                /layers/placement on its own loads; replicas split equally), mean over layers
    rows        the max/mean of the rows the ranks received (/routing/rank_overload), mean over
                layers: what the placement really gave, replicas split by sequence
    time        max/mean over the ranks of the expert phases' time (experts + experts_bwd),
                median over steps
    step ms     the median step time, and the speed-up over the contiguous layout
    modelled    the step the cost model (bench/cost_model.py, docs/performance.md) gives with the
                predicted max/mean as its load factor, from a calibration run of 1 rank and
                1 thread that the script makes first; and measured ÷ modelled

Every run of a workload must give the same parameters (the digest), which the script checks.
Medians over --rounds runs. Writes OUT/placement.md (the table), OUT/placement.csv and
OUT/placement.png (predicted against measured). OPENBLAS_CORETYPE is left as it is.
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = {
    "forced": ["--force-balance", "zipf:1.2"],
    "natural": ["--bias-update-rate", "0", "--seq-aux-loss-weight", "0"],
}
RANKS = 2


def mpirun(binary, args):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run(["mpirun", "-np", str(RANKS), binary] + args, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"placement.py: moe_rt {' '.join(args)} failed:\n{proc.stderr}")
    found = re.findall(r"digest ([0-9a-f]{16})", proc.stdout)
    if not found:
        sys.exit(f"placement.py: no parameter digest in the output of moe_rt {' '.join(args)}")
    return found[-1]


def replay(path, window, extra):
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "moe_stats.py"), "placement", path,
           "--ranks", str(RANKS), "--window", str(window)] + extra
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"placement.py: {' '.join(cmd)} failed:\n{proc.stderr}")
    return proc.stdout


def predicted_overload(path, window):
    """The replay's mean overload of the placement the run ran under (its 'recorded' rows)."""
    rows = csv.DictReader(replay(path, window, ["--policies", "recorded", "--csv"]).splitlines())
    values = [float(r["mean_overload"]) for r in rows
              if r["policy"] == "recorded" and r["layers"].isdigit()]  # per layer
    return statistics.fmean(values)


def modelled_step_ms(calibration, load_factor, redundant, tokens_per_rank):
    """The cost model's step at RANKS ranks on this host's cores, with `load_factor`."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import cost_model as cm
    run = cm.read_run(calibration)
    lay = cm.Layout(ranks=RANKS, ep=RANKS, ranks_per_host=RANKS, cores_per_host=os.cpu_count(),
                    tokens_per_rank=tokens_per_rank, load_factor=load_factor, redundant=redundant)
    link = cm.Link(1e9, 0.0, 0.0)  # one host: no link
    return sum(cm.predict(cm.calibrate(run), cm.model_of(run), lay, link).values()) * 1e3


def measured(path, window):
    with h5py.File(path, "r") as f:
        steps = f["steps/step"][...]
        keep = steps >= window
        phases = [p.decode() for p in f["perf/phases"][...]]
        time = f["perf/phase_time"][...][keep]  # [N, W, phases]
        experts = time[:, :, phases.index("experts")] + time[:, :, phases.index("experts_bwd")]
        return {
            "rows": float(f["routing/rank_overload"][...][keep].mean()),
            "time": float(np.median(experts.max(axis=1) / experts.mean(axis=1))),
            "step_ms": float(np.median(f["steps/step_time_s"][...][keep]) * 1e3),
            "experts_ms": float(np.median(experts.max(axis=1)) * 1e3),
        }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "moe_rt"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "placement"))
    ap.add_argument("--replot", action="store_true",
                    help="only draw OUT/placement.png again from OUT/placement.csv")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.replot:
        with open(os.path.join(a.out, "placement.csv")) as f:
            rows = [{k: (v if k in ("workload", "placement") else float(v)) for k, v in r.items()}
                    for r in csv.DictReader(f)]
        plot(rows, os.path.join(a.out, "placement.png"))
        return
    base = ["--model", "deepseek4-tiny", "--steps", str(a.steps), "--overwrite"]
    calibration = os.path.join(a.out, "tiny-calibration.log")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with open(calibration, "w") as log:
        subprocess.run(["mpirun", "-np", "1", a.binary, "--model", "deepseek4-tiny", "--threads",
                        "1", "--steps", "20", "--stats", "none"], env=env, stdout=log,
                       stderr=subprocess.STDOUT, check=True)
    results = []
    for workload, options in WORKLOADS.items():
        record = os.path.join(a.out, f"{workload}-record.h5")
        mpirun(a.binary, base + options + ["--stats", record])
        placements = {"contiguous, R=0": None}
        for redundant in (0, 2):
            writes = []
            for policy in ("greedy", "hierarchical"):
                path = os.path.join(a.out, f"{workload}-{policy}-r{redundant}.txt")
                placements[f"{policy}, R={redundant}"] = path
                writes += ["--write", f"{policy}:{path}"]
            replay(record, a.window, ["--redundant", str(redundant)] + writes)
        runs = {label: [] for label in placements}
        digests = set()
        for r in range(a.rounds):
            for label, path in placements.items():
                stats = os.path.join(a.out, f"{workload}-{label.replace(', ', '-')}-{r}.h5")
                extra = [] if path is None else ["--expert-placement", path]
                digests.add(mpirun(a.binary, base + options + extra + ["--stats", stats]))
                runs[label].append(measured(stats, a.window) | {"file": stats})
        if len(digests) != 1:
            sys.exit(f"placement.py: {workload}: the placements gave different parameters: "
                     f"{sorted(digests)}")
        contiguous_ms = statistics.median(m["step_ms"] for m in runs["contiguous, R=0"])
        for label, ms in runs.items():
            row = {"workload": workload, "placement": label,
                   "predicted": predicted_overload(ms[0]["file"], a.window)}
            for key in ("rows", "time", "step_ms", "experts_ms"):
                row[key] = statistics.median(m[key] for m in ms)
            row["speedup"] = contiguous_ms / row["step_ms"]
            redundant = 2 if label.endswith("R=2") else 0
            row["modelled_ms"] = modelled_step_ms(calibration, row["predicted"], redundant, 256)
            row["ratio"] = row["step_ms"] / row["modelled_ms"]
            results.append(row)
            print(f"{workload:8} {label:18} predicted {row['predicted']:.3f} rows {row['rows']:.3f}"
                  f" time {row['time']:.3f} step {row['step_ms']:.1f} ms x{row['speedup']:.3f}",
                  flush=True)
    keys = ["workload", "placement", "predicted", "rows", "time", "experts_ms", "step_ms",
            "speedup", "modelled_ms", "ratio"]
    with open(os.path.join(a.out, "placement.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows({k: r[k] for k in keys} for r in results)
    lines = ["| workload | placement | predicted max/mean | rows max/mean | expert time max/mean "
             "| expert phases ms (slowest rank) | step ms | speed-up | modelled step ms | "
             "measured ÷ modelled |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['workload']} | {r['placement']} | {r['predicted']:.3f} | "
                     f"{r['rows']:.3f} | {r['time']:.3f} | {r['experts_ms']:.1f} | "
                     f"{r['step_ms']:.1f} | {r['speedup']:.3f} | {r['modelled_ms']:.1f} | "
                     f"{r['ratio']:.2f} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "placement.md"), "w") as f:
        f.write(table)
    print(table)
    plot(results, os.path.join(a.out, "placement.png"))


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    markers = {"forced": "o", "natural": "s"}
    for r in results:
        ax.scatter(r["predicted"], r["time"], marker=markers[r["workload"]], color="tab:blue")
        ax.scatter(r["predicted"], r["rows"], marker=markers[r["workload"]], color="tab:orange")
    lim = [1.0, max(max(r["predicted"], r["time"], r["rows"]) for r in results) * 1.05]
    ax.plot(lim, lim, color="0.6", linewidth=0.8, linestyle="--")
    ax.set_xlabel("predicted max / mean rank load (replay)")
    ax.set_ylabel("measured max / mean over the 2 ranks")
    ax.scatter([], [], color="tab:orange", label="rows received")
    ax.scatter([], [], color="tab:blue", label="expert-phase time")
    for name, m in markers.items():
        ax.scatter([], [], color="0.3", marker=m, label=name)
    ax.legend(fontsize=8)
    ax.set_title("prediction against measurement")
    labels = [f"{r['workload']}\n{r['placement']}" for r in results]
    bx.barh(range(len(results)), [r["speedup"] for r in results], color="tab:green")
    bx.set_yticks(range(len(results)), labels, fontsize=7)
    bx.axvline(1.0, color="0.4", linewidth=0.8)
    bx.set_xlim(0.9, max(r["speedup"] for r in results) * 1.03)
    bx.invert_yaxis()
    bx.set_xlabel("step speed-up over the contiguous layout")
    bx.set_title("step time (median)")
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

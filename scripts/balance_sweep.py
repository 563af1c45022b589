#!/usr/bin/env python3
"""Sweep of the learning rate (lr), the loss-free bias rate (gamma) and the balance-loss weight
(alpha) on deepseek4-tiny: which settings keep the top-k layers balanced, at what cost in loss.

Every run trains the default global batch (8 sequences a step) for --steps steps on --np ranks
(a step is bitwise the same on any rank count: docs/architecture.md), writes its statistics
file under --out, and is summarised by
  - loss: the mean training loss over the last 20 steps;
  - worst violation: max over top-k layers of (max load - mean load) / mean load, at a few steps
    and as the mean over the last 20 steps (0 = balanced, E/K - 1 = 1.667 = every token's K
    experts the same);
and the table (Markdown) and a figure of the worst violation per step go to --out.

    python3 scripts/balance_sweep.py --steps 200 --out runs/balance-sweep
    python3 scripts/balance_sweep.py --grid 'lr=1e-3 gamma=1e-2 alpha=1e-4' --steps 1000 ...

Needs the built moe_rt (scripts/run.sh or scripts/test.sh builds it) and Open MPI's mpirun.
"""
import argparse
import itertools
import os
import subprocess
import sys

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from mpi_launch import launcher, run_env  # noqa: E402  (tests/mpi_launch.py: mpirun flags)

GLOBAL_BATCH = 8
DEFAULT_GRID = {"lr": ["3e-3", "1e-3", "3e-4"], "gamma": ["1e-3", "3e-3", "1e-2"],
                "alpha": ["1e-4"]}


def parse_grid(text):
    """'lr=1e-3,3e-4 gamma=1e-2 alpha=0,1e-4' -> {name: [values]}; names missing take the
    default grid's values."""
    grid = dict(DEFAULT_GRID)
    for item in text.split():
        name, _, values = item.partition("=")
        if name not in grid or not values:
            raise SystemExit(f"balance_sweep: bad --grid item '{item}' (lr=..., gamma=..., alpha=...)")
        grid[name] = values.split(",")
    return grid


def run_one(binary, out, np_, steps, lr, gamma, alpha, extra):
    name = f"lr{lr}_g{gamma}_a{alpha}"
    path = os.path.join(out, name + ".h5")
    if not os.path.exists(path):
        command = launcher(np_) + [binary, "--model", "deepseek4-tiny", "--steps", str(steps),
                                   "--batch-per-rank", str(GLOBAL_BATCH // np_), "--lr", lr,
                                   "--bias-update-rate", gamma, "--seq-aux-loss-weight", alpha,
                                   "--stats", path] + extra
        with open(os.path.join(out, name + ".log"), "w") as log:
            proc = subprocess.run(command, env=run_env(), stdout=log, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise SystemExit(f"balance_sweep: {name} failed (exit {proc.returncode}); see its log")
    return name, path


def summarise(path):
    with h5py.File(path, "r") as f:
        loss = f["steps/loss"][...]
        violation = f["routing/max_violation"][...]              # [N, L]
        topk = np.array([r == "topk" for r in f["layers/routing"].asstr()[...]])
    worst = violation[:, topk].max(axis=1)                        # [N]
    return loss, worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--np", type=int, default=2, help="ranks (a divisor of 8)")
    parser.add_argument("--grid", default="", help="e.g. 'lr=1e-3,3e-4 gamma=1e-2 alpha=1e-4'")
    parser.add_argument("--out", default="runs/balance-sweep")
    parser.add_argument("--bin", default=os.path.join(ROOT, "build", "moe_rt"))
    parser.add_argument("extra", nargs="*", help="more moe_rt options, after --")
    args = parser.parse_args()
    if GLOBAL_BATCH % args.np:
        raise SystemExit(f"balance_sweep: --np {args.np} does not divide {GLOBAL_BATCH}")
    if not os.path.exists(args.bin):
        raise SystemExit(f"balance_sweep: no moe_rt at {args.bin}: build it first (scripts/test.sh)")
    os.makedirs(args.out, exist_ok=True)
    grid = parse_grid(args.grid)
    marks = [s for s in (50, 100, 150, 200, 500, 1000) if s < args.steps] + [args.steps - 1]
    rows, curves = [], {}
    for lr, gamma, alpha in itertools.product(grid["lr"], grid["gamma"], grid["alpha"]):
        name, path = run_one(args.bin, args.out, args.np, args.steps, lr, gamma, alpha, args.extra)
        loss, worst = summarise(path)
        curves[name] = worst
        tail = slice(max(0, len(loss) - 20), len(loss))
        rows.append((lr, gamma, alpha, float(gamma) / float(lr), loss[tail].mean(),
                     [worst[s] for s in marks], worst[tail].mean()))
        print(f"{name}: loss {loss[tail].mean():.4f}, worst violation {worst[tail].mean():.3f}",
              flush=True)
    header = ("| lr | gamma | alpha | gamma/lr | loss (last 20) | "
              + " | ".join(f"worst viol. step {s}" for s in marks) + " | worst viol. (last 20) |")
    lines = [header, "|" + "---|" * (6 + len(marks))]
    for lr, gamma, alpha, ratio, loss, at, tail in rows:
        lines.append(f"| {lr} | {gamma} | {alpha} | {ratio:.2g} | {loss:.4f} | "
                     + " | ".join(f"{v:.3f}" for v in at) + f" | {tail:.3f} |")
    table = "\n".join(lines)
    print("\n" + table)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, worst in curves.items():
        ax.plot(np.arange(len(worst)), worst, label=name, linewidth=1)
    ax.axhline(8 / 3 - 1, color="k", linestyle=":", linewidth=1)
    ax.text(0, 8 / 3 - 1 + 0.03, "collapse: E/K - 1 = 1.667", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("worst top-k load violation (1)")
    ax.set_title(f"deepseek4-tiny, global batch {GLOBAL_BATCH}: lr x gamma x alpha")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "sweep.png"), dpi=100)
    print(f"\ntable and figure: {args.out}/table.md, {args.out}/sweep.png")


if __name__ == "__main__":
    main()

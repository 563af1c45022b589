"""How much a step's expert loads follow the data order: the noise and the drift of the load
variance in the hash-routed layers, whose loads depend on the step's tokens alone (a fixed
token -> experts table), for the two --data-order orders of a real-text shard and for synthetic
data, and what the order does to the balancing and the loss (docs/load-balancing.md, "Real
text").

Per hash layer l, with v_t the population variance of its expert loads at step t
(/routing/load_variance):
  median, max   the step-to-step factor max(v_t, v_t+1) / min(v_t, v_t+1): the noise of one step
  span          max_t v_t / min_t v_t over the run
  lag-1 corr    the correlation of log v_t with log v_t+1: how much a step resembles the last
                (0 for independent steps)
  20-step span  max / min of the means of v over blocks of 20 steps: the drift that averaging
                20 steps, as the section's tables do, does not remove
Per run: the worst top-k violation (max over the top-k layers of (max c - mean c)/mean c),
mean over each 20 steps; the loss, mean of the last 20 steps; the validation losses if the run
evaluated.

Usage:
  python3 bench/data_order.py                   # the three runs (2 ranks, 200 steps), then the tables
  python3 bench/data_order.py --steps 100       # shorter runs
  python3 bench/data_order.py --files A.h5 ...  # the tables of existing statistics files

The runs are the default deepseek4-tiny run of that section, on 2 ranks of 4 sequences, with the
held-out shard evaluated every 50 steps (which changes no bit of training):
  mpirun -np 2 build/moe_rt --model deepseek4-tiny --batch-per-rank 4 --data DATA \
      [--data-order ORDER] --val-data VAL --eval-every 50 --stats OUT/NAME.h5 --overwrite
with DATA tokens:data/python-docs/train.bin (made by `python3 scripts/prepare_data.py`, VAL its
val.bin) in each order, and synthetic (VAL synthetic). Exit status 2 with one line on bad input
or a failed run."""
import argparse
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD = os.path.join("data", "python-docs", "train.bin")
VAL = os.path.join("data", "python-docs", "val.bin")
RUNS = [("sequential", f"tokens:{SHARD}", f"tokens:{VAL}", "sequential"),
        ("shuffled", f"tokens:{SHARD}", f"tokens:{VAL}", "shuffled"),
        ("synthetic", "synthetic", "synthetic", None)]
BLOCK = 20  # steps per block of the drift and the balancing columns


class BenchError(Exception):
    pass


def step_factors(v):
    """[T-1] max/min of each pair of consecutive steps' variances."""
    a, b = v[:-1], v[1:]
    return np.maximum(a, b) / np.minimum(a, b)


def block_means(x):
    """Means of x over whole blocks of BLOCK steps (the last, partial block left out)."""
    n = len(x) // BLOCK * BLOCK
    return x[:n].reshape(-1, BLOCK).mean(axis=1)


def read_run(path):
    """The figures of one statistics file: (per-layer rows, per-run summary)."""
    if not os.path.isfile(path):
        raise BenchError(f"{path}: no such file")
    try:
        with h5py.File(path, "r") as f:
            rows = f["steps/step"][...] >= 0
            variance = f["routing/load_variance"][...][rows]  # [T, L]
            violation = f["routing/max_violation"][...][rows]  # [T, L]
            loss = f["steps/loss"][...][rows]
            hash_layers = int(f["config"].attrs["hash-layers"])
            val = []
            if "eval" in f:
                evaluated = f["eval/step"][...] >= 0
                val = list(zip(f["eval/step"][...][evaluated], f["eval/loss"][...][evaluated]))
    except (OSError, KeyError) as e:
        raise BenchError(f"{path}: not a moe_rt statistics file with routing loads ({e})")
    if variance.shape[0] < 2 * BLOCK:
        raise BenchError(f"{path}: {variance.shape[0]} step(s), need at least {2 * BLOCK}")
    layers = []
    for layer in range(variance.shape[1]):
        v = variance[:, layer]
        if np.any(v <= 0):
            raise BenchError(f"{path}: layer {layer} has a step of variance 0 (exact balance): "
                             "no factor")
        factors = step_factors(v)
        log_v = np.log(v)
        blocks = block_means(v)
        layers.append({"layer": layer, "routing": "hash" if layer < hash_layers else "top-k",
                       "median": float(np.median(factors)), "max": float(factors.max()),
                       "span": float(v.max() / v.min()),
                       "corr": float(np.corrcoef(log_v[:-1], log_v[1:])[0, 1]),
                       "block_span": float(blocks.max() / blocks.min())})
    topk = violation[:, hash_layers:]
    summary = {"steps": variance.shape[0],
               "worst": block_means(topk.max(axis=1)) if topk.shape[1] else np.array([]),
               "loss_last": float(loss[-BLOCK:].mean()), "val": val}
    return layers, summary


def span_text(values, digits):
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def tables(named_paths):
    runs = [(name, *read_run(path)) for name, path in named_paths]  # all read, or none printed
    print("load variance per layer: step-to-step factor max(v_t, v_t+1)/min(...), its span "
          f"max/min over the run, lag-1 correlation of log v, span of {BLOCK}-step means")
    print(f"{'run':12s} {'steps':>5s} {'layer':>5s} {'routing':7s} {'median':>7s} {'max':>7s} "
          f"{'span':>8s} {'lag-1':>6s} {BLOCK:>3d}-step span")
    for name, layers, s in runs:
        for r in layers:
            print(f"{name:12s} {s['steps']:5d} {r['layer']:5d} {r['routing']:7s} "
                  f"{r['median']:7.2f} {r['max']:7.2f} {r['span']:8.1f} {r['corr']:6.2f} "
                  f"{r['block_span']:8.2f}")
    print("\nhash layers (the range over them)")
    for name, layers, s in runs:
        hashed = [r for r in layers if r["routing"] == "hash"]
        if not hashed:
            continue
        print(f"{name:12s} median factor {span_text([r['median'] for r in hashed], 2)}, "
              f"at most {max(r['max'] for r in hashed):.1f}, span "
              f"{span_text([r['span'] for r in hashed], 1)}, lag-1 correlation "
              f"{span_text([r['corr'] for r in hashed], 2)}, {BLOCK}-step span "
              f"{span_text([r['block_span'] for r in hashed], 2)}")
    print(f"\nworst top-k violation, mean over each {BLOCK} steps; loss, mean of the last "
          f"{BLOCK}; validation loss after each evaluated step")
    for name, _, s in runs:
        worst = " ".join(f"{w:.2f}" for w in s["worst"])
        val = ", ".join(f"{step}: {loss:.4f}" for step, loss in s["val"]) or "none"
        print(f"{name:12s} worst {worst} | loss {s['loss_last']:.4f} | validation {val}")


def run_all(args):
    moe_rt = args.moe_rt if os.path.isabs(args.moe_rt) else os.path.join(ROOT, args.moe_rt)
    if not os.access(moe_rt, os.X_OK):
        raise BenchError(f"{args.moe_rt}: no moe_rt binary there (build it, or give --moe-rt)")
    for path in (SHARD, VAL):
        if not os.path.isfile(os.path.join(ROOT, path)):
            raise BenchError(f"{path}: missing; make it with `python3 scripts/prepare_data.py`")
    launcher = shutil.which("mpirun") or shutil.which("mpiexec")
    if launcher is None:
        raise BenchError("no mpirun or mpiexec on the PATH")
    out = args.out if os.path.isabs(args.out) else os.path.join(ROOT, args.out)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    named_paths = []
    for name, data, val, order in RUNS:
        stats = os.path.join(out, f"{name}.h5")
        command = [launcher, "-np", "2", moe_rt, "--model", "deepseek4-tiny", "--batch-per-rank",
                   "4", "--data", data, "--val-data", val, "--eval-every", "50", "--steps",
                   str(args.steps), "--stats", stats, "--overwrite", "--log-every", "50"]
        if order:
            command += ["--data-order", order]
        print("+", " ".join(command), flush=True)
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BenchError(f"moe_rt ({name}) failed with status {proc.returncode}: "
                             f"{(proc.stderr.strip().splitlines() or ['no message'])[-1]}")
        named_paths.append((name, stats))
    return named_paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", nargs="+", metavar="H5",
                        help="statistics files to tabulate instead of running")
    parser.add_argument("--moe-rt", default=os.path.join("build", "moe_rt"),
                        help="the binary (default build/moe_rt)")
    parser.add_argument("--steps", type=int, default=200, help="steps of each run (200)")
    parser.add_argument("--out", default=os.path.join("runs", "data-order"),
                        help="folder of the runs' statistics files (runs/data-order)")
    args = parser.parse_args(argv)
    try:
        if args.steps < 2 * BLOCK:
            raise BenchError(f"--steps {args.steps}: need at least {2 * BLOCK}")
        if args.files:
            named_paths = [(os.path.splitext(os.path.basename(p))[0], p) for p in args.files]
        else:
            named_paths = run_all(args)
        tables(named_paths)
    except BenchError as e:
        print(f"data_order.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

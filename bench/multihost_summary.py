"""The summary tables of bench/multihost.sh: for each case (a folder's NAME.alltoall.txt from
bench_alltoall and NAME.h5 from moe_rt), the token exchange against raw MPI_Alltoallv and the
training step with its exchange phases.

Usage: python3 bench/multihost_summary.py OUTDIR CASE...
(files CASE.alltoall2.txt: bench_alltoall on 2 ranks; CASE.alltoall.txt: on all ranks, both
optional; CASE.h5: moe_rt's statistics)

Step figures: the median over steps 1.. (step 0 warms up) of the slowest rank's step time, of the
global tokens/s, and of each phase's mean over ranks (/perf/phase_time); "exchange" = dispatch +
combine + dispatch_bwd + combine_bwd (MPI_Ialltoallv/MPI_Alltoallv with their waits and
permutations), "allreduce" the gradient and statistics reductions."""
import os
import sys

import h5py
import numpy as np

EXCHANGE = ("dispatch", "combine", "dispatch_bwd", "combine_bwd")


def alltoall_rows(path):
    """{(routing, tokens): (ep median us, raw median us, ratio)} from bench_alltoall's table."""
    rows = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 21 and parts[0] in ("zipf", "balanced") and parts[5] == "|":
                rows[(parts[0], int(parts[1]))] = (float(parts[6]), float(parts[13]),
                                                   float(parts[20]))
    return rows


def step_figures(path, link_bytes_path):
    with open(link_bytes_path) as b:
        link_bytes = int(b.read())
    with h5py.File(path, "r") as f:
        phases = list(f["perf/phases"].asstr()[...])
        times = f["perf/phase_time"][1:]  # [N-1, W, phases]
        mean = times.mean(axis=1)  # over ranks
        col = {p: np.median(mean[:, phases.index(p)]) * 1e3 for p in phases}
        return {
            "step_ms": np.median(f["steps/step_time_s"][1:]) * 1e3,
            "tokens_s": np.median(f["steps/tokens_per_s"][1:]),
            "exchange_ms": sum(col[p] for p in EXCHANGE),
            "allreduce_ms": col["allreduce"],
            "experts_ms": col["experts"] + col["experts_bwd"],
            "world": int(f.attrs["world_size"]),
            "ep": int(f.attrs["ep_size"]),
            # The whole run's bytes (set-up included: small) per step, both directions.
            "link_mb": link_bytes / len(f["steps/step"]) / 1e6,
        }


def main(outdir, cases):
    print("\ntoken exchange, bench_alltoall (E=8, K=3, D=128; median us of the slowest rank; "
          "ratio = dispatch+combine / raw MPI_Alltoallv there and back)")
    print(f"{'case':34s} {'routing':8s} {'tokens':>6s} {'ep us':>10s} {'raw us':>10s} "
          f"{'ratio':>6s}")
    for suffix, ranks in (("alltoall2", "2 ranks"), ("alltoall", "all ranks")):
        for case in cases:
            path = os.path.join(outdir, f"{case}.{suffix}.txt")
            if not os.path.exists(path):  # a case that ran moe_rt alone
                continue
            rows = alltoall_rows(path)
            for (routing, tokens), (ep, raw, ratio) in sorted(rows.items()):
                print(f"{case + ', ' + ranks:34s} {routing:8s} {tokens:6d} {ep:10.1f} {raw:10.1f} "
                      f"{ratio:6.3f}")
    print("\ntraining step, moe_rt deepseek4-tiny (medians over steps 1..; phases: mean over "
          "ranks, ms; MB/step: through host 1's link, both directions)")
    print(f"{'case':28s} {'ranks':>5s} {'P':>3s} {'step ms':>8s} {'tokens/s':>9s} {'exchange':>9s} "
          f"{'allreduce':>9s} {'experts':>8s} {'step x':>7s} {'MB/step':>8s}")
    base = None
    for case in cases:
        s = step_figures(os.path.join(outdir, f"{case}.h5"),
                         os.path.join(outdir, f"{case}.link_bytes"))
        base = base or s["step_ms"]
        print(f"{case:28s} {s['world']:5d} {s['ep']:3d} {s['step_ms']:8.1f} {s['tokens_s']:9.0f} "
              f"{s['exchange_ms']:9.1f} {s['allreduce_ms']:9.1f} {s['experts_ms']:8.1f} "
              f"{s['step_ms'] / base:7.2f} {s['link_mb']:8.1f}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])

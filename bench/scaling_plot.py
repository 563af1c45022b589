#!/usr/bin/env python3
"""The figure of bench/scaling.sh: tokens/s, MFU and peak memory per rank against the rank count,
one line per case (deepseek4-tiny at each expert count E, and deepseek4-fine).

    python3 bench/scaling_plot.py runs/scaling/scaling.tsv runs/scaling/scaling.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend)


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: scaling_plot.py TABLE.tsv OUT.png")
    rows = read_rows(sys.argv[1])
    if not rows:
        sys.exit(f"scaling_plot.py: {sys.argv[1]} has no rows")
    cases = list(dict.fromkeys(r["case"] for r in rows))
    panels = [("tokens_per_s", "tokens/s"), ("mfu_pct", "MFU (% of the sgemm peak)"),
              ("peak_rss_mib", "peak resident MiB per rank")]
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.2))
    for ax, (key, title) in zip(axes, panels):
        for case in cases:
            mine = [r for r in rows if r["case"] == case]
            ranks = [int(r["ranks"]) for r in mine]
            ax.plot(ranks, [float(r[key]) for r in mine], marker="o",
                    label="deepseek4-fine" if case == "fine" else f"tiny, E={case[1:]}")
        ax.set_xscale("log", base=2)
        ax.set_xticks([int(r) for r in sorted({r["ranks"] for r in rows}, key=int)])
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("ranks (global batch fixed)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[-1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"figure: {sys.argv[2]}")


if __name__ == "__main__":
    main()

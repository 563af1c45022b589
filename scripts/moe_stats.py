#!/usr/bin/env python3
"""Post-hoc analysis of moe_rt statistics files (HDF5, format "moe_rt.stats", version 1).

    moe_stats.py summary RUN.h5 [--no-chain]
        configuration, the files of a resumed run, steps, loss against the data's entropy floor,
        throughput, and the balance of each layer at a glance.
    moe_stats.py variance RUN_A.h5 [RUN_B.h5] [--steps S0,S1] [--markdown | --csv] [--no-chain]
        the per-layer load-variance table of MaxText pull request #4190: variance at step S0
        (run A), at step S1 in A and in B, improvement (A - B)/A, and a TOTAL row over the top-k
        layers (the sums, then the improvement of the sums).
    moe_stats.py plot RUN_A.h5 [RUN_B.h5] --out DIR [--no-chain]
        PNG figures: expert-load heatmaps, variance and max violation, bias trajectories, per-rank
        load and overload, loss.

    A resumed run's file names its predecessor (root attributes resumed_from, resumed_from_step):
    the whole chain of files is read as one run, unless --no-chain reads the named file alone.

The file layout is documented in docs/hdf5-schema.md, its analysis in docs/analysis.md. A file
that is still being written, or whose writer was killed, is opened for SWMR reading; only rows
present in every per-step dataset count as complete. Errors are one line on stderr and exit code
2. Importable: the tests call the functions and `main(argv)`.

This file is the command line; the work is done in moe_stats_lib/ (next to this script), whose
names are re-exported here so that `moe_stats.load_run` and the like keep working.

Shapes: N complete rows (steps), L layers, E experts, W ranks.
"""
from __future__ import annotations

import argparse
import os
import sys

# moe_stats_lib sits next to this file; imported from elsewhere, the folder may not be on the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# Re-exported: the tests and other callers use these as moe_stats.NAME.
from moe_stats_lib.chain import (check_consecutive, check_same_model, join_files, load_run,
                                 predecessor_path, read_predecessors)
from moe_stats_lib.plot import (mark_resumes, panel_grid, plot_balance, plot_bias,
                                plot_expert_load, plot_layer_lines, plot_loss, plot_ranks, pyplot,
                                run_tags, save, step_axis)
from moe_stats_lib.plot import write_plots as _write_plots
from moe_stats_lib.stats_file import (FORMAT_NAME, FORMAT_VERSION, OPTIONAL_PER_STEP,
                                      REQUIRED_PER_STEP, ROUTING_LABELS, SWMR_READ_ATTEMPTS, Run,
                                      Segment, StatsError, balance_layers, check_format,
                                      check_same_shape, complete_rows, decode, entropy_floor,
                                      hdf5_library, open_stats_file, open_swmr,
                                      parse_config_text, rank_overload, read_file,
                                      read_per_step, read_strings, resume_attributes,
                                      routing_label, row_of_step, swmr_fapl, topk_mask)
from moe_stats_lib.summary import (SUMMARY_CONFIG_KEYS, render_summary,
                                   summary_config_lines, summary_layer_rows,
                                   summary_progress_lines, summary_segment_lines)
from moe_stats_lib.variance import (VARIANCE_REL_TOL, VarianceRow, VarianceTable,
                                    default_steps, format_percent, improvement, layer_variances,
                                    markdown_line, pad_rows, parse_steps, relative_change,
                                    render_csv, render_markdown, render_text, routing_mismatches,
                                    row_cells, stored_variance_warning, table_grid,
                                    variance_headers, variance_mismatches, variance_table)

PROG = "moe_stats.py"


def write_plots(runs, out_dir, dpi=80):
    """moe_stats_lib.plot.write_plots through this module's `save`, so that replacing
    `moe_stats.save` (as the plot tests do) sees every figure."""
    return _write_plots(runs, out_dir, dpi, save=save)


# ---------------------------------------------------------------------------------------------
# Command line


def positive_int(text):
    """argparse type: a whole number >= 1 (argparse then reports a bad one in its usage line)."""
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def add_no_chain(parser):
    parser.add_argument("--no-chain", action="store_true",
                        help="read each named file alone, not the files it was resumed from")


def build_parser():
    usage_block = __doc__.split("\n\nThe file layout")[0]
    parser = argparse.ArgumentParser(prog=PROG, description=usage_block,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Errors: one line on stderr, exit code 2.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("summary", help="configuration, loss, throughput, per-layer balance")
    p.add_argument("run", help="statistics file (HDF5)")
    add_no_chain(p)
    p = sub.add_parser("variance", help="the per-layer load-variance table, run A against run B")
    p.add_argument("run_a", help="run A (also the step-0 baseline)")
    p.add_argument("run_b", nargs="?", help="run B, compared with A at the second step")
    p.add_argument("--steps", metavar="S0,S1",
                   help="two /steps/step values (default: run A's first step and the last "
                        "step present in every run)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="markdown table")
    fmt.add_argument("--csv", action="store_true", help="CSV, full precision, %% without sign")
    add_no_chain(p)
    p = sub.add_parser("plot", help="PNG figures")
    p.add_argument("run_a", help="run A (solid lines)")
    p.add_argument("run_b", nargs="?", help="run B (dashed lines)")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--dpi", type=positive_int, default=80, help="resolution of the PNG files")
    add_no_chain(p)
    return parser


def warn(messages, stream):
    for message in messages:
        print(f"{PROG}: warning: {message}", file=stream)


def load_runs(args):
    """Run A, and run B when given."""
    paths = [args.run_a] + ([args.run_b] if args.run_b else [])
    return [load_run(path, chain=not args.no_chain) for path in paths]


def command_summary(args, out, err):
    run = load_run(args.run, chain=not args.no_chain)
    out.write(render_summary(run))
    warn(stored_variance_warning(run), err)


def command_variance(args, out, err):
    runs = load_runs(args)
    step0, step1 = parse_steps(args.steps) if args.steps else default_steps(runs)
    table = variance_table(runs[0], runs[1] if len(runs) > 1 else None, step0, step1)
    warn(variance_mismatches(runs[0], [row_of_step(runs[0], step0), row_of_step(runs[0], step1)]),
         err)
    if len(runs) > 1:
        warn(variance_mismatches(runs[1], [row_of_step(runs[1], step1)]), err)
        warn(routing_mismatches(runs[0], runs[1]), err)
    render = render_csv if args.csv else render_markdown if args.markdown else render_text
    out.write(render(table))


def command_plot(args, out, err):
    runs = load_runs(args)
    for path in write_plots(runs, args.out, args.dpi):
        out.write(path + "\n")


def main(argv=None, out=None, err=None):
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    commands = {"summary": command_summary, "variance": command_variance, "plot": command_plot}
    try:
        commands[args.command](args, out, err)
    except StatsError as error:
        print(f"{PROG}: error: {error}", file=err)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

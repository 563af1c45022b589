#!/usr/bin/env python3
"""Post-hoc analysis of moe_rt statistics files (HDF5, format "moe_rt.stats", versions 1 and 2).

    moe_stats.py summary RUN.h5 [--no-chain]
        configuration, the files of a resumed run, steps, loss against the data's entropy floor,
        throughput, the assignments dropped by a token capacity (--capacity-factor), the
        balance of each layer at a glance and its expert-load distribution.
    moe_stats.py variance RUN_A.h5 [RUN_B.h5] [--steps S0,S1] [--markdown | --csv] [--no-chain]
        the per-layer load-variance table of MaxText pull request #4190: variance at step S0
        (run A), at step S1 in A and in B, improvement (A - B)/A, and a TOTAL row over the top-k
        layers (the sums, then the improvement of the sums).
    moe_stats.py plot RUN_A.h5 [RUN_B.h5] [--out DIR] [--format png,pdf,svg] [--dpi N]
                      [--label NAME]... [--layers L,...] [--steps S0:S1] [--paper] [--no-chain]
        figures: expert-load heatmaps, variance and max violation, load-distribution metrics,
        the drop rate of a run with a token capacity, bias trajectories, per-rank load and
        overload, loss, phase times, shadow balancers. --paper: one column wide (3.5 in),
        serif, PDF at 300 dpi unless --format and --dpi say otherwise.
    moe_stats.py compare RUN_1.h5 RUN_2.h5 [RUN_3.h5 ...] [--label NAME]... [--window W]
                      [--layers L,...] [--markdown | --csv] [--out DIR | --no-figures]
                      [--format ...] [--dpi N] [--paper] [--no-chain]
        runs of one model shape side by side: a table with a column per run (last step,
        loss, validation loss, max violation per layer and the worst, drop rate), the figure
        compare.png (loss, validation loss, worst max violation, drop rate against the step)
        and, for each run after the first, its expert-load heatmaps beside run 1's and their
        difference (expert_load_diff_I.png).
    moe_stats.py export RUN.h5 --format csv|parquet [--what TABLE[,TABLE...]|all] [-o OUT]
        tidy long tables (steps, layers, loads, bias, ranks, phases, traces, shadow_violation)
        for pandas.
    moe_stats.py tensorboard RUN.h5 LOGDIR [--label NAME] [--overwrite]
        TensorBoard event files in LOGDIR/NAME: losses, optimiser, throughput, phase times,
        the drop rate, per-layer balance metrics, per-rank load, expert-load histograms; tags
        metric first (violation/layer03, assignments/rank01), one section per metric.
    moe_stats.py mlflow RUN.h5 [--tracking-uri URI] [--experiment NAME] [--run-name NAME]
                      [--no-figures] [--no-chain]
        one MLflow run (default store: the folder ./mlruns): the configuration as parameters,
        the scalars of `tensorboard` under the same names at each step, the figures as
        artifacts.
    moe_stats.py watch RUN.h5 [--interval S] [--timeout S]
        follows a running job's file: a line per new step and a per-layer balance table; ends
        when the writer closes the file or is gone. Reads the named file only (of a resumed
        run, the file being written now).
    moe_stats.py traces RUN.h5 [--no-chain]
        from the per-token traces (--trace-every): routing stability between traced steps,
        routing of frequent and rare tokens, and what the bias changes.
    moe_stats.py shadows RUN.h5 [--no-chain]
        the shadow balancers of a run with --shadow against the run's own policy, per top-k
        layer: the worst max violation, its mean over the last quarter of the steps, the final.
    moe_stats.py placement RUN.h5 --ranks P [--hosts H | --ranks-per-host N] [--redundant R]
                      [--every N] [--window W] [--policies contiguous,greedy,hierarchical]
                      [--markdown | --csv] [--out DIR] [--write POLICY:FILE]... [--no-chain]
        replays expert placement policies on the run's recorded loads (expert_load - dropped):
        per policy (and the placement the run ran under, where its file records it), the rank
        overload max/mean over the steps scored (each placement computed from earlier steps
        only), the rows crossing hosts, the experts a re-placement moves and their bytes; --out
        draws placement.png; --write saves the placement a policy gives from the run's last W
        steps, the file moe_rt --expert-placement reads.

    A resumed run's file names its predecessor (root attributes resumed_from, resumed_from_step):
    the whole chain of files is read as one run, unless --no-chain reads the named file alone
    (watch always reads the named file alone).

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
from moe_stats_lib.plot import (PlotOptions, layer_color, mark_resumes, panel_grid,
                                plot_balance, plot_bias, plot_drop_rate, plot_expert_load,
                                plot_layer_lines, plot_loss, plot_metrics, plot_phases,
                                plot_ranks, pyplot, run_tags, save, select_steps, step_axis)
from moe_stats_lib.plot import write_plots as _write_plots
from moe_stats_lib import compare as _compare
from moe_stats_lib.compare_figures import write_compare_figures
from moe_stats_lib.figure_style import PAPER, SCREEN, palette, short_labels
from moe_stats_lib.stats_file import (FORMAT_NAME, FORMAT_VERSION, OPTIONAL_PER_STEP,
                                      REQUIRED_PER_STEP, ROUTING_LABELS, SWMR_READ_ATTEMPTS, Run,
                                      Segment, StatsError, balance_layers, capacity_factor,
                                      check_format,
                                      check_same_shape, complete_rows, decode, entropy_floor,
                                      hdf5_library, open_stats_file, open_swmr,
                                      parse_config_text, rank_overload, read_file,
                                      read_per_step, read_strings, resume_attributes,
                                      routing_label, row_of_step, shadow_rules, swmr_fapl,
                                      topk_mask)
from moe_stats_lib import export as _export
from moe_stats_lib import tensorboard_events as _tensorboard
from moe_stats_lib import mlflow_tracking as _mlflow
from moe_stats_lib import traces as _traces
from moe_stats_lib import watch as _watch
from moe_stats_lib.metrics import (METRICS, PERCENTILES, capacity_on, collapse_ceiling,
                                   drop_fraction, layer_metrics, load_metrics, load_ratio,
                                   step_drop_rate)
from moe_stats_lib.summary import (SUMMARY_CONFIG_KEYS, render_summary,
                                   summary_config_lines, summary_drop_lines, summary_layer_rows,
                                   summary_progress_lines, summary_segment_lines)
from moe_stats_lib.shadows import (policy_violations, render_shadows, shadow_table,
                                   worst_over_layers)
from moe_stats_lib.traces import load_traces, render_traces
from moe_stats_lib import placement as _placement
from moe_stats_lib.placement_file import (Placement, check_placement_fits, make_placement,
                                          placement_text, read_placement, write_placement)
from moe_stats_lib.placement_policies import POLICIES, HostLayout, ModelShape
from moe_stats_lib.variance import (VARIANCE_REL_TOL, VarianceRow, VarianceTable,
                                    default_steps, format_percent, improvement, layer_variances,
                                    markdown_line, pad_rows, parse_steps, relative_change,
                                    render_csv, render_markdown, render_text, routing_mismatches,
                                    row_cells, stored_variance_warning, table_grid,
                                    variance_headers, variance_mismatches, variance_table)

PROG = "moe_stats.py"
FIGURE_FORMATS = ("png", "pdf", "svg")


def write_plots(runs, out_dir, dpi=80, options=None):
    """moe_stats_lib.plot.write_plots through this module's `save`, so that replacing
    `moe_stats.save` (as the plot tests do) sees every figure."""
    return _write_plots(runs, out_dir, dpi, save=save, options=options)


# ---------------------------------------------------------------------------------------------
# Command line


def positive_int(text):
    """argparse type: a whole number >= 1 (argparse then reports a bad one in its usage line)."""
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


# Past this a figure's pixels no longer fit in memory (8 x 6.5 inches at 1200 dpi: 300 MB of RGBA;
# at 100000 dpi Agg fails to allocate); print needs 300 to 600.
MAX_DPI = 1200


def dpi_value(text):
    """argparse type: --dpi, a whole number from 1 to MAX_DPI."""
    value = positive_int(text)
    if value > MAX_DPI:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_DPI} (print needs 300 to 600), "
                                         f"got {text!r}")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def formats(text):
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    bad = [name for name in names if name not in FIGURE_FORMATS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected png, pdf or svg (comma-separated), got "
                                         f"{text!r}")
    return tuple(dict.fromkeys(names))


def int_list(text):
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected layer numbers such as 3,4,6, got {text!r}")
    return tuple(dict.fromkeys(int(p) for p in parts))


def step_range(text):
    first, sep, last = text.partition(":")
    try:
        lo = int(first) if first.strip() else -(2 ** 62)
        hi = int(last) if last.strip() else 2 ** 62
    except ValueError:
        lo, hi = 1, 0
    if not sep or lo > hi:
        raise argparse.ArgumentTypeError(f"expected S0:S1 (steps, inclusive), got {text!r}")
    return lo, hi


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
    p = sub.add_parser("plot", help="figures (PNG, PDF, SVG)")
    p.add_argument("run_a", help="run A (solid lines)")
    p.add_argument("run_b", nargs="?", help="run B (dashed lines)")
    p.add_argument("--out", help="output folder (created if missing); default: beside run A, "
                                 "named after it (RUN_A-plots)")
    add_figure_options(p)
    p.add_argument("--label", action="append", default=[], metavar="NAME",
                   help="name of run A in legends and titles; again for run B (default: the "
                        "file names without folder and .h5)")
    p.add_argument("--layers", type=int_list, metavar="L,...",
                   help="layers drawn (default: all; the balance figures: the top-k layers)")
    p.add_argument("--steps", type=step_range, metavar="S0:S1",
                   help="steps drawn, S0 to S1 inclusive (either may be left out)")
    add_no_chain(p)
    add_compare_parser(sub)
    p = sub.add_parser("export", help="tidy tables as CSV or Parquet")
    p.add_argument("run", help="statistics file (HDF5)")
    p.add_argument("--format", required=True, choices=_export.FORMATS)
    p.add_argument("--what", default="all",
                   help=f"{', '.join(_export.TABLES)}; several comma-separated, or all "
                        f"(default; traces and shadow_violation only where the file has them)")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="file for one table, folder for several; one CSV table without -o "
                        "goes to stdout")
    add_no_chain(p)
    p = sub.add_parser("tensorboard", help="TensorBoard event files")
    p.add_argument("run", help="statistics file (HDF5)")
    p.add_argument("logdir", help="TensorBoard log folder; the run goes to LOGDIR/LABEL")
    p.add_argument("--label", help="the run's name in TensorBoard (default: the file's name "
                                   "without .h5)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the event files already in LOGDIR/LABEL")
    add_no_chain(p)
    p = sub.add_parser("mlflow", help="log the run to an MLflow tracking store")
    p.add_argument("run", help="statistics file (HDF5)")
    p.add_argument("--tracking-uri", metavar="URI",
                   help=f"MLflow tracking URI, or a folder for a file store (default: "
                        f"MLFLOW_TRACKING_URI, else ./{_mlflow.DEFAULT_STORE})")
    p.add_argument("--experiment", metavar="NAME",
                   help=f"experiment, created if missing (default "
                        f"'{_mlflow.DEFAULT_EXPERIMENT}')")
    p.add_argument("--run-name", metavar="NAME",
                   help="the MLflow run's name (default: the file's name without .h5)")
    p.add_argument("--no-figures", action="store_true",
                   help="leave out the figures (artifacts), which take most of the time")
    add_no_chain(p)
    p = sub.add_parser("watch", help="follow a running job's file")
    p.add_argument("run", help="statistics file (HDF5), being written or not")
    p.add_argument("--interval", type=positive_float, default=2.0,
                   help="seconds between refreshes (default 2)")
    p.add_argument("--timeout", type=positive_float,
                   help="stop after this many seconds (exit code 124)")
    p = sub.add_parser("traces", help="routing stability and token routing from /trace")
    p.add_argument("run", help="statistics file (HDF5)")
    add_no_chain(p)
    p = sub.add_parser("shadows", help="shadow balancers (--shadow) against the run's own policy")
    p.add_argument("run", help="statistics file (HDF5) of a run with --shadow")
    add_no_chain(p)
    add_placement_parser(sub)
    return parser


def add_placement_parser(sub):
    # Counts are plain int here and checked by the command, so that a bad value is one line on
    # stderr naming the option, as a bad file is.
    p = sub.add_parser("placement", help="replay expert placement policies on the recorded loads")
    p.add_argument("run", help="statistics file (HDF5)")
    p.add_argument("--ranks", type=int, required=True, metavar="P",
                   help="EP ranks to place the experts on (1 to E)")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("--hosts", type=int, metavar="H",
                       help="the P ranks on H hosts of P/H consecutive ranks (default 1)")
    hosts.add_argument("--ranks-per-host", type=int, metavar="N",
                       help="hosts of N consecutive ranks (N divides P, or is a multiple of it)")
    p.add_argument("--redundant", type=int, default=0, metavar="R",
                   help="replicas to place beyond the E experts (default 0; contiguous ignores "
                        "them)")
    p.add_argument("--every", type=int, default=0, metavar="N",
                   help="re-place every N steps from the W steps before (default 0: one "
                        "placement from the first W steps, scored on the rest)")
    p.add_argument("--window", type=int, metavar="W",
                   help="steps of loads a placement is computed from (default: N with --every "
                        "N, else the first quarter of the steps)")
    p.add_argument("--policies", metavar="LIST",
                   help=f"comma-separated, of {', '.join(POLICIES)}, and {_placement.RECORDED} "
                        f"(the placement the run ran under, /layers/placement) (default: all, "
                        f"{_placement.RECORDED} where the file has it on P ranks)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="markdown tables")
    fmt.add_argument("--csv", action="store_true",
                     help="CSV, one row per policy and layer or kind of layer, full precision")
    p.add_argument("--out", metavar="DIR",
                   help="folder for the figure placement.png (created if missing)")
    p.add_argument("--write", action="append", default=[], metavar="POLICY:FILE",
                   help="write the placement POLICY gives from the run's last W steps to FILE "
                        "(moe_rt --expert-placement FILE); again for more")
    add_no_chain(p)


def add_figure_options(p):
    """--format, --dpi and --paper, of plot and compare; their defaults follow the style."""
    p.add_argument("--format", type=formats,
                   help="png, pdf, svg, or several comma-separated (default png; with --paper "
                        "pdf)")
    p.add_argument("--dpi", type=dpi_value,
                   help=f"resolution of PNG files and of heatmap pixels, 1 to {MAX_DPI} "
                        f"(default 80; with --paper 300)")
    p.add_argument("--paper", action="store_true",
                   help="figures for a paper: one column wide (3.5 in), serif fonts, legends "
                        "below the panels, PDF at 300 dpi")


def figure_options(args, **fields):
    """PlotOptions of --format, --dpi and --paper (and `fields`)."""
    style = PAPER if args.paper else SCREEN
    return PlotOptions(formats=args.format or style.formats, dpi=args.dpi or style.dpi,
                       paper=args.paper, **fields)


def add_compare_parser(sub):
    p = sub.add_parser("compare", help="two or more runs side by side: a table and figures")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="statistics files (HDF5) of runs of one model shape, 2 or more; the "
                        "first is the one the others' expert loads are compared with")
    p.add_argument("--label", action="append", default=[], metavar="NAME",
                   help="name of a run in the table and legends, once per run in order "
                        "(default: the file names without folder and .h5, made unique)")
    p.add_argument("--window", type=positive_int, default=1, metavar="W",
                   help="loss and max violation: the mean over each run's last W steps, the "
                        "drop rate summed over them (default 1: the last step)")
    p.add_argument("--layers", type=int_list, metavar="L,...",
                   help="layers of the max violation rows and the heatmaps (default: those "
                        "top-k in any run)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="markdown table")
    fmt.add_argument("--csv", action="store_true",
                     help="CSV, full precision, %% without sign, empty where a run has none")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR",
                       help="folder for the figures (created if missing); default: beside the "
                            "first run, named after it (RUN_1-compare)")
    where.add_argument("--no-figures", action="store_true", help="the table alone")
    add_figure_options(p)
    add_no_chain(p)


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


def default_plots_dir(path, suffix="-plots"):
    """RUN-plots (RUN + suffix) beside the file; of a link (runs/latest.h5), named after the file
    it points to, so that the figures of each run keep a folder of their own."""
    name = os.path.basename(os.path.realpath(path))
    return os.path.join(os.path.dirname(path), os.path.splitext(name)[0] + suffix)


def command_plot(args, out, err):
    runs = load_runs(args)
    options = figure_options(args, labels=tuple(args.label), layers=args.layers or (),
                             steps=args.steps or ())
    out_dir = args.out or default_plots_dir(args.run_a)
    for path in write_plots(runs, out_dir, options.dpi, options=options):
        out.write(path + "\n")


def command_compare(args, out, err):
    runs = [load_run(path, chain=not args.no_chain) for path in args.runs]
    _compare.check_comparable(runs)
    labels = _compare.run_labels(runs, tuple(args.label))
    layers = _compare.compared_layers(runs, args.layers or ())
    warn(_compare.routing_mismatches(runs), err)
    table = _compare.compare_table(runs, labels, layers, args.window)
    render = (_compare.render_csv if args.csv else _compare.render_markdown if args.markdown
              else _compare.render_text)
    text = render(table)
    out_dir = args.out or default_plots_dir(args.runs[0], "-compare")
    paths = [] if args.no_figures else write_compare_figures(
        runs, labels, layers, out_dir, figure_options(args), save=save,
        warn=lambda message: warn([message], err))
    if paths and not args.csv:
        text += "\nfigures:\n" + "".join(f"{path}\n" for path in paths)
    out.write(text)


def command_export(args, out, err):
    run = load_run(args.run, chain=not args.no_chain)
    what = _export.parse_what(args.what)
    if args.what == "all" and not load_traces(run):
        what.remove("traces")
    if args.what == "all" and "perf/phase_time" not in run.data:
        what.remove("phases")
    if args.what == "all" and not shadow_rules(run):
        what.remove("shadow_violation")
    for path in _export.export(run, what, args.format, args.output, out):
        out.write(path + "\n")


def command_tensorboard(args, out, err):
    run = load_run(args.run, chain=not args.no_chain)
    out.write(_tensorboard.write_events(run, args.logdir, args.label, args.overwrite) + "\n")


def command_mlflow(args, out, err):
    run = load_run(args.run, chain=not args.no_chain)
    uri = _mlflow.tracking_uri(args.tracking_uri)
    logged = _mlflow.log_run(run, uri, args.experiment, args.run_name,
                             figures=not args.no_figures)
    out.write(f"mlflow run {logged.run_id} (experiment {logged.experiment_id}) in {uri}: "
              f"{logged.params} parameters, {logged.metrics} metric values, {logged.figures} "
              f"figures\n")
    if uri.startswith("file:"):
        out.write(f"view: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {uri}\n")


def command_watch(args, out, err):
    return _watch.watch(args.run, out, interval=args.interval, timeout=args.timeout)


def command_traces(args, out, err):
    run = load_run(args.run, chain=not args.no_chain)
    out.write(render_traces(run, load_traces(run)))


def command_shadows(args, out, err):
    run = load_run(args.run, chain=not args.no_chain)
    out.write(render_shadows(run))


def parse_writes(texts):
    """[(policy, path)] of the --write options; StatsError for a bad one."""
    writes = []
    for text in texts:
        policy, colon, path = text.partition(":")
        if not colon or not path:
            raise StatsError(f"--write {text!r}: expected POLICY:FILE, e.g. greedy:placement.txt")
        if policy not in POLICIES:
            raise StatsError(f"--write {text!r}: unknown policy '{policy}' (known: "
                             f"{', '.join(POLICIES)})")
        writes.append((policy, path))
    return writes


def command_placement(args, out, err):
    writes = parse_writes(args.write)
    run = load_run(args.run, chain=not args.no_chain)
    if args.ranks < 1:     # before the hosts, whose message would otherwise name P
        raise StatsError(f"--ranks {args.ranks}: expected 1 to {run.num_experts} EP ranks")
    hosts = _placement.host_layout(args.ranks, args.hosts, args.ranks_per_host)
    if args.policies is None:
        policies = _placement.default_policies(run, args.ranks, args.every, args.window)
    else:
        policies = tuple(dict.fromkeys(p.strip() for p in args.policies.split(",")
                                       if p.strip()))
    replay = _placement.replay(run, args.ranks, hosts, args.redundant, args.every, args.window,
                               policies)
    render = (_placement.render_csv if args.csv else
              _placement.render_markdown if args.markdown else _placement.render_text)
    text = render(replay)
    if args.out:
        path = _placement.plot_replay(replay, args.out)
        if not args.csv:
            text += f"\nfigure: {path}\n"
    for policy, path in writes:
        _placement.write_next_placement(path, run, policy, args.ranks, hosts, args.redundant,
                                        replay.window)
        if not args.csv:
            text += f"placement ({policy}, from the last {replay.window} steps): {path}\n"
    out.write(text)


def main(argv=None, out=None, err=None):
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(argv)
    commands = {"summary": command_summary, "variance": command_variance, "plot": command_plot,
                "compare": command_compare,
                "export": command_export, "tensorboard": command_tensorboard,
                "mlflow": command_mlflow,
                "watch": command_watch, "traces": command_traces,
                "shadows": command_shadows, "placement": command_placement}
    try:
        code = commands[args.command](args, out, err)
    except StatsError as error:
        print(f"{PROG}: error: {error}", file=err)
        return 2
    except BrokenPipeError:            # e.g. `export ... | head`: the reader has all it wants
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code or 0


if __name__ == "__main__":
    sys.exit(main())

"""The logic behind scripts/moe_stats.py, the post-hoc analysis of moe_rt statistics files (HDF5,
format "moe_rt.stats", versions 1 and 2; layout in docs/hdf5-schema.md, analysis in
docs/analysis.md).

    stats_file  opening, checking and reading one file into a Run; the facts derived from a run
    chain       a resumed run: the file and the predecessors it names, joined into one Run
    metrics     per-layer, per-step expert-load metrics (CV, percentiles, dead experts, entropy,
                the token capacity's drop rate)
    variance    the per-layer load-variance table of MaxText pull request #4190: text, markdown, CSV
    summary     the key facts of one run as text
    plot        figures of one run or two (PNG, PDF, SVG)
    figure_style        the screen and paper styles, the series palette, short run labels
    figure_parts        what the figures are built from: panels, legends, saving, heatmaps
    compare     two or more runs side by side: the table (compare_figures: its figures)
    export      tidy CSV and Parquet tables
    scalars     the per-step scalars under the metric-first names both exports below give them
    tensorboard_events  TensorBoard event files
    mlflow_tracking     a run logged to an MLflow tracking store
    watch       following a file while it is written
    traces      what the per-token routing traces say
    shadows     the shadow balancers (--shadow) against the run's own policy
    placement_file      expert placement files (moe_rt --expert-placement): read, check, write
    placement_policies  placement policies: contiguous, greedy, EPLB's hierarchical
    placement   the placement replay: policies scored on the recorded loads, tables, figure

Dependencies point one way: everything -> stats_file; summary, plot, export, scalars, watch ->
metrics; export -> traces; summary, plot, export, scalars -> shadows (summary and shadows also use
variance's column padding); tensorboard_events, mlflow_tracking -> scalars, and mlflow_tracking ->
plot for the figures; placement -> placement_policies ->
placement_file, and placement uses variance's column padding and plot's figure helpers;
plot, compare_figures -> figure_parts -> figure_style; compare -> metrics, figure_style. The
command line lives in scripts/moe_stats.py, which re-exports these names.
"""

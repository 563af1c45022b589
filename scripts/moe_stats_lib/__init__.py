"""The logic behind scripts/moe_stats.py, the post-hoc analysis of moe_rt statistics files (HDF5,
format "moe_rt.stats", version 1; layout in docs/hdf5-schema.md, analysis in docs/analysis.md).

    stats_file  opening, checking and reading one file into a Run; the facts derived from a run
    chain       a resumed run: the file and the predecessors it names, joined into one Run
    variance    the per-layer load-variance table of MaxText pull request #4190: text, markdown, CSV
    summary     the key facts of one run as text
    plot        PNG figures of one run or two

Dependencies point one way: chain, summary, variance, plot -> stats_file (summary also uses
variance's column padding). The command line lives in scripts/moe_stats.py, which re-exports
these names.
"""

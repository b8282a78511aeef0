"""Aggregation of bench run folders into tables, plots and a report.

CLI: ``python -m multirun_analysis PATH [PATH ...] [--out DIR]``.  Notebook API::

    from multirun_analysis import load_runs, summarize, compare_to_baseline, plot_throughput
    runs = load_runs("multirun/2026-01-01/12-00-00")   # one row per run folder
    summary = summarize(runs)                          # one row per experiment, vs baseline
    plot_throughput(summary)                           # a matplotlib Figure
    pred = prediction_table(["multirun/2026-01-01/12-00-00"])  # every run re-planned: predicted vs measured
    plot_prediction(pred); rank_correlation(pred)      # the scatter plot; Spearman per group of layouts
    side_by_side(planned(["dry-run-sweep"]), pred)     # a dry run's plans beside the measured runs

Exact definitions of every summary column: ``multirun_analysis.DEFINITIONS`` (the docstring
of multirun_analysis/summarize.py, also at the end of report.md).
"""
from multirun_analysis.analyze import Analysis, analyze
from multirun_analysis.load import config_columns, find_runs, load_runs, problems_of, read_run
from multirun_analysis.plots import (NoDataError, make_plots, plot_memory, plot_mfu, plot_pp_microbatches,
                                     plot_scaling_efficiency, plot_throughput, plot_variants)
from multirun_analysis.answer import default_vs_best, ranked
from multirun_analysis.planned import planned
from multirun_analysis.prediction import accuracy, prediction_table, rank_correlation
from multirun_analysis.prediction_plot import plot_prediction
from multirun_analysis.versus import side_by_side
from multirun_analysis.report import compact_table
from multirun_analysis.summarize import (DEFINITIONS, compare_to_baseline, experiment_key, failed_runs,
                                         fixed_overhead, summarize, variant_labels)

__all__ = ["Analysis", "analyze", "config_columns", "find_runs", "load_runs", "problems_of", "read_run",
           "NoDataError", "make_plots", "plot_memory", "plot_mfu", "plot_pp_microbatches",
           "plot_scaling_efficiency", "plot_throughput", "plot_variants", "compact_table", "ranked", "default_vs_best", "prediction_table", "accuracy",
           "planned", "rank_correlation", "plot_prediction", "side_by_side",
           "DEFINITIONS", "compare_to_baseline", "experiment_key", "failed_runs", "fixed_overhead", "summarize",
           "variant_labels"]

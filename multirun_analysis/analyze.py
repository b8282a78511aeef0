"""The whole pipeline (what the CLI runs): load -> summarize -> tables, plots, report.

Kept separate from the CLI so that a notebook or a test gets the same files from one call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from multirun_analysis import trust
from multirun_analysis.load import load_runs, problems_of
from multirun_analysis.planned import planned
from multirun_analysis.plots import NoDataError, make_plots
from multirun_analysis.prediction import prediction_table
from multirun_analysis.prediction_plot import plot_prediction
from multirun_analysis.report import write_report
from multirun_analysis.versus import side_by_side
from multirun_analysis.summarize import failed_runs, fixed_overhead, summarize


@dataclass
class Analysis:
    out_dir: Path
    runs: pd.DataFrame
    summary: pd.DataFrame
    failed: pd.DataFrame
    overhead: pd.DataFrame | None = None
    problems: list = field(default_factory=list)
    plots: dict = field(default_factory=dict)
    report: Path | None = None
    prediction: pd.DataFrame | None = None
    plans: pd.DataFrame | None = None  # a dry run's planned layouts (multirun_analysis/planned.py)
    side_by_side: pd.DataFrame | None = None  # plans beside measurements, when both are analysed


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Arrow needs one type per column: a config key that is an int in one run and a string
    in another (or bool/str) becomes text, nulls kept."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            kinds = {type(v) for v in df[c] if v is not None and not (isinstance(v, float) and v != v)}
            if len(kinds) > 1:
                df[c] = df[c].map(lambda v: None if v is None or (isinstance(v, float) and v != v) else str(v))
    return df


def write_tables(out_dir: Path, runs: pd.DataFrame, summary: pd.DataFrame, failed: pd.DataFrame,
                 problems: list, overhead: pd.DataFrame | None = None) -> None:
    runs.to_csv(out_dir / "runs.csv", index=False)
    try:
        _parquet_safe(runs).to_parquet(out_dir / "runs.parquet", index=False)
    except Exception as e:  # a table is still in runs.csv: report, do not fail the analysis
        problems.append(("", f"runs.parquet not written ({type(e).__name__}: {e})"))
    summary.to_csv(out_dir / "summary.csv", index=False)
    failed.to_csv(out_dir / "failed_runs.csv", index=False)
    if overhead is not None:
        overhead.to_csv(out_dir / "fixed_overhead.csv", index=False)


def analyze(*paths, out_dir=None, plots: bool = True, memory_budget_gib: float | None = None) -> Analysis:
    """Analyse the runs under ``paths``; write everything into out_dir (default <paths[0]>/analysis).
    ``memory_budget_gib``: rank only strategies whose measured peak per GPU fits (multirun_analysis/answer.py)."""
    out = Path(out_dir) if out_dir is not None else Path(paths[0]) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(*paths, warn=False)
    problems = problems_of(runs)
    summary = summarize(runs)
    for _, r in summary[summary["baseline_note"].notna()].iterrows() if len(summary) else []:
        problems.append(("", f"{r['model']}/{r['label']} ws={r['world_size']:g}: {r['baseline_note']}"))
    if trust.unrecorded_host_load(runs):
        problems.append(("", trust.unrecorded_host_load(runs)))
    failed = failed_runs(runs)
    overhead = fixed_overhead(runs)
    write_tables(out, runs, summary, failed, problems, overhead)
    figs = make_plots(summary, out) if plots else {}
    prediction = prediction_table(paths)
    prediction.to_csv(out / "prediction.csv", index=False)
    plans = planned(paths, memory_budget_gib)
    both = side_by_side(plans, prediction)
    if len(plans):
        plans.to_csv(out / "planned.csv", index=False)
    if len(both):
        both.to_csv(out / "side_by_side.csv", index=False)
    if plots:
        figs["prediction"] = _prediction_figure(both if len(both) else prediction, out)
    report = write_report(out, [str(p) for p in paths], runs, summary, failed, figs, problems, overhead,
                          memory_budget_gib, prediction, plans, both)
    return Analysis(out, runs, summary, failed, overhead, problems, figs, report, prediction, plans, both)


def _prediction_figure(t: pd.DataFrame, out: Path) -> tuple:
    """prediction.png (multirun_analysis/prediction_plot.py), or why there is none."""
    try:
        fig = plot_prediction(t, by="strategy" if "variant" not in t.columns else None)
    except NoDataError as e:
        return None, f"skipped: {e}"
    fig.savefig(out / "prediction.png", dpi=120, bbox_inches="tight")
    return fig, str(out / "prediction.png")

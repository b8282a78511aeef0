"""``python -m multirun_analysis PATH [PATH ...] [--out DIR]``: analyse bench sweeps.

Writes runs.csv/.parquet, summary.csv, failed_runs.csv, PNG plots and report.md, and prints
a compact summary, the failed runs and the data problems.  Broken run folders are reported,
never fatal; the exit status is 1 only when no run folder was found at all.
"""
from __future__ import annotations

import argparse
import sys

from multirun_analysis import answer, versus
from multirun_analysis.analyze import analyze
from multirun_analysis.planned import planned_section
from multirun_analysis.report import compact_table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multirun_analysis", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="multirun / run folders (searched at any depth)")
    ap.add_argument("--out", default=None, help="output folder (default: <first PATH>/analysis)")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    ap.add_argument("--memory-budget-gib", type=float, default=None,
                    help="rank only strategies whose measured peak memory per GPU (a dry run's: the memory it "
                         "needs) fits this many GiB")
    a = ap.parse_args(argv)
    res = analyze(*a.paths, out_dir=a.out, plots=not a.no_plots, memory_budget_gib=a.memory_budget_gib)
    plans = res.plans
    if res.side_by_side is not None and len(res.side_by_side):  # plans and their measurement: one table
        print("\n".join(versus.section(res.side_by_side)))
    elif len(plans):  # a dry-run sweep: the answer before any GPU is spent
        print("\n".join(planned_section(plans, a.memory_budget_gib)))
    if res.runs.empty and len(plans):
        print(f"wrote {res.report}")
        return 0
    if res.runs.empty:
        print(f"no run folders (with .hydra/config.yaml, metrics.json or status.json) under: {' '.join(a.paths)}",
              file=sys.stderr)
        for d, p in res.problems:
            print(f"  problem: {d} {p}", file=sys.stderr)
        return 1
    print(compact_table(res.summary))
    print("\n" + "\n".join(answer.ranked(res.summary, a.memory_budget_gib)))
    if len(res.failed):
        print(f"\n{len(res.failed)} failed/incomplete run(s):")
        for _, r in res.failed.iterrows():
            print(f"  {r['status']:<11} {r['run_dir']}: {r['reason']}")
    if res.problems:
        print(f"\n{len(res.problems)} problem(s):")
        for d, p in res.problems:
            print(f"  {d or '(input)'}: {p}")
    for name, (fig, note) in res.plots.items():
        if fig is None:
            print(f"plot {name}: {note}")
    print(f"\nwrote {res.out_dir}/ (runs.csv, runs.parquet, summary.csv, prediction.csv, [planned.csv, side_by_side.csv,] fixed_overhead.csv, failed_runs.csv, report.md, plots)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

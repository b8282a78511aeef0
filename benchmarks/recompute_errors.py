"""The recorded runs of one recompute setting, re-predicted with the shipped calibration (its host factors), as
predicted / measured tokens/s - 1: per results folder the runs, median |error| and mean error, then all of them.
Run at two commits to compare a change to the prediction (docs/results.md, full recompute, 2026-12-05).

    python benchmarks/recompute_errors.py full results/
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from bench.plan.predict import combine, load_calibration
from bench.run.recorded import load_runs, result_folders


def main(recompute: str, dirs: list[str]) -> None:
    runs, _ = load_runs(result_folders([Path(d) for d in dirs]))
    cal = load_calibration()
    by_folder: dict[str, list[float]] = {}
    for r in runs:
        if r["plan"].layout.recompute != recompute:
            continue
        t = {**r["terms"], "host_factor": (cal.get("host_factors") or {}).get(r["host"], 1.0)}
        by_folder.setdefault(r["folder"], []).append(r["step"] / float(combine(t, cal["constants"])["step_time_s"]) - 1)
    print("| folder | runs | median \\|error\\| | mean error |\n|---|---:|---:|---:|")
    for folder, errors in sorted(by_folder.items()):
        print(f"| {folder} | {len(errors)} | {100 * statistics.median(map(abs, errors)):.1f}% | "
              f"{100 * statistics.mean(errors):+.1f}% |")
    every = [e for errors in by_folder.values() for e in errors]
    print(f"| all | {len(every)} | {100 * statistics.median(map(abs, every)):.1f}% | {100 * statistics.mean(every):+.1f}% |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["results"])

"""The recorded runs of one setting, re-predicted with the shipped calibration (its host factors), as
predicted / measured tokens/s - 1: per results folder the runs, median |error| and mean error, then all of them.
Run at two commits to compare a change to the prediction (docs/results.md: full recompute and fp8's matmul size,
2026-12-05).  SETTING is ``recompute=<value>`` or ``precision=<value>`` (a bare value means recompute's).

    python benchmarks/run_errors.py recompute=full results/
    python benchmarks/run_errors.py precision=fp8 results/
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from bench.plan.predict import combine, load_calibration
from bench.run.recorded import load_runs, result_folders

SETTINGS = {"recompute": lambda plan: plan.layout.recompute, "precision": lambda plan: plan.run.precision}


def main(setting: str, dirs: list[str]) -> None:
    key, _, value = setting.rpartition("=")
    if (key or "recompute") not in SETTINGS:
        sys.exit(f"SETTING {setting!r}: give recompute=<value> or precision=<value>")
    of = SETTINGS[key or "recompute"]
    runs, _ = load_runs(result_folders([Path(d) for d in dirs]))
    cal = load_calibration()
    by_folder: dict[str, list[float]] = {}
    for r in runs:
        if of(r["plan"]) != value:
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

"""The recorded runs of one setting, re-predicted with the shipped calibration (its host factors), as
predicted / measured tokens/s - 1: per results folder the runs, median |error| and mean error, then all of them.
Run at two commits to compare a change to the prediction (docs/results.md: full recompute and fp8's matmul size,
2026-12-05).  SETTING is ``recompute=<value>``, ``precision=<value>`` or ``zero_stage=<stage>`` (ZeRO runs of that
stage on more than one GPU); a bare value means recompute's.  ``--held-out``: each folder's runs predicted by
constants fitted without that folder (the calibration's own error measure, bench/calibrate.py), not the shipped fit.

    python benchmarks/run_errors.py recompute=full results/
    python benchmarks/run_errors.py precision=fp8 results/
    python benchmarks/run_errors.py zero_stage=1 results/ --held-out
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from bench.calibrate import leave_one_folder_out
from bench.plan.predict import combine, load_calibration
from bench.run.recorded import load_runs, result_folders

SETTINGS = {"recompute": lambda plan: plan.layout.recompute, "precision": lambda plan: plan.run.precision,
            "zero_stage": lambda plan: str(plan.strategy.zero_stage)
            if plan.strategy.name == "zero" and plan.world_size > 1 else None}


def main(setting: str, dirs: list[str], held_out: bool = False) -> None:
    key, _, value = setting.rpartition("=")
    if (key or "recompute") not in SETTINGS:
        sys.exit(f"SETTING {setting!r}: give recompute=<value>, precision=<value> or zero_stage=<stage>")
    of = SETTINGS[key or "recompute"]
    runs, _ = load_runs(result_folders([Path(d) for d in dirs]))
    cal = load_calibration()
    held = leave_one_folder_out(runs) if held_out else None  # frozen folders included: all fitted, one out at a time
    by_folder: dict[str, list[float]] = {}
    for i, r in enumerate(runs):
        if of(r["plan"]) != value:
            continue
        if held is not None:
            predicted = held[i]
        else:
            t = {**r["terms"], "host_factor": (cal.get("host_factors") or {}).get(r["host"], 1.0)}
            predicted = float(combine(t, cal["constants"])["step_time_s"])
        by_folder.setdefault(r["folder"], []).append(r["step"] / predicted - 1)
    print("| folder | runs | median \\|error\\| | mean error |\n|---|---:|---:|---:|")
    for folder, errors in sorted(by_folder.items()):
        print(f"| {folder} | {len(errors)} | {100 * statistics.median(map(abs, errors)):.1f}% | "
              f"{100 * statistics.mean(errors):+.1f}% |")
    every = [e for errors in by_folder.values() for e in errors]
    print(f"| all | {len(every)} | {100 * statistics.median(map(abs, every)):.1f}% | {100 * statistics.mean(every):+.1f}% |")
    print(f"median error of all: {100 * statistics.median(every):+.1f}%")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--held-out"]
    main(args[0], args[1:] or ["results"], held_out="--held-out" in sys.argv[1:])

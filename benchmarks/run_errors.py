"""The recorded runs of some settings, re-predicted with the shipped calibration (its host factors), as
predicted / measured tokens/s - 1: per results folder the runs, median |error| and mean error, then all of them.
Run at two commits to compare a change to the prediction (docs/results.md: full recompute and fp8's matmul size,
2026-12-05).  Each SETTING is ``key=value`` (a run is kept where all hold): ``recompute``, ``precision``,
``zero_stage`` (ZeRO runs of that stage on more than one GPU), ``model``, ``strategy``, ``world_size``,
``link_regime``; a bare first value means recompute's.  ``--held-out``: each folder's runs predicted by constants
fitted without that folder (the calibration's own error measure, bench/calibrate.py), not the shipped fit.
``--breakdown``: also each run's measured step beside the prediction's parts (shipped fit), and the ratio
(measured - compute) / (exposed communication + host): how much longer than predicted what is not compute took.

    python benchmarks/run_errors.py recompute=full results/
    python benchmarks/run_errors.py precision=fp8 results/
    python benchmarks/run_errors.py zero_stage=1 results/ --held-out
    python benchmarks/run_errors.py link_regime=sockets world_size=4 results/ --breakdown
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from bench.calibrate import leave_one_folder_out
from bench.plan.predict import combine, load_calibration
from bench.run.recorded import load_runs, result_folders

SETTINGS = {"recompute": lambda r: r["plan"].layout.recompute, "precision": lambda r: r["plan"].run.precision,
            "zero_stage": lambda r: str(r["plan"].strategy.zero_stage)
            if r["plan"].strategy.name == "zero" and r["plan"].world_size > 1 else None,
            "model": lambda r: r["plan"].run.model.name, "strategy": lambda r: r["plan"].strategy.name,
            "world_size": lambda r: str(r["plan"].world_size), "link_regime": lambda r: r["regime"]}


def parse(settings: list[str]) -> list[tuple[str, str]]:
    """``key=value`` pairs, a bare first value as recompute's; an unknown key exits naming the valid ones."""
    out = []
    for i, s in enumerate(settings):
        key, _, value = s.rpartition("=")
        key = key or ("recompute" if i == 0 else "")
        if key not in SETTINGS:
            sys.exit(f"SETTING {s!r}: give key=value with key one of {', '.join(SETTINGS)}")
        out.append((key, value))
    return out


def breakdown_line(r: dict, parts: dict) -> str:
    """One run: measured and predicted step, the prediction's compute / exposed communication / host, and how much
    longer than predicted the measured step's non-compute part took."""
    ms = {k: 1000 * float(parts[k]) for k in ("step_time_s", "compute_s", "exposed_comm_s", "host_s", "bubble_s")}
    rest = ms["exposed_comm_s"] + ms["bubble_s"] + ms["host_s"]
    ratio = f"{(1000 * r['step'] - ms['compute_s']) / rest:.2f}" if rest > 0 else "-"
    p = r["plan"]
    return (f"| {r['folder']} | {p.run.model.name} {p.strategy.name} ws={p.world_size} tp={p.tp} pp={p.pp} "
            f"| {1000 * r['step']:.1f} | {ms['step_time_s']:.1f} | {ms['compute_s']:.1f} | {ms['exposed_comm_s']:.1f} "
            f"| {ms['host_s']:.1f} | {ratio} |")


def main(settings: list[str], dirs: list[str], held_out: bool = False, breakdown: bool = False) -> None:
    wanted = parse(settings)
    runs, _ = load_runs(result_folders([Path(d) for d in dirs]))
    cal = load_calibration()
    held = leave_one_folder_out(runs) if held_out else None  # frozen folders included: all fitted, one out at a time
    by_folder: dict[str, list[float]] = {}
    lines = []
    for i, r in enumerate(runs):
        if any(SETTINGS[k](r) != v for k, v in wanted):
            continue
        parts = None if held is not None and not breakdown else combine(
            {**r["terms"], "host_factor": (cal.get("host_factors") or {}).get(r["host"], 1.0)}, cal["constants"])
        predicted = held[i] if held is not None else float(parts["step_time_s"])
        by_folder.setdefault(r["folder"], []).append(r["step"] / predicted - 1)
        if breakdown:
            lines.append(breakdown_line(r, parts))
    if not by_folder:
        sys.exit(f"no recorded run under {', '.join(dirs)} has {' '.join(settings)}")
    print("| folder | runs | median \\|error\\| | mean error |\n|---|---:|---:|---:|")
    for folder, errors in sorted(by_folder.items()):
        print(f"| {folder} | {len(errors)} | {100 * statistics.median(map(abs, errors)):.1f}% | "
              f"{100 * statistics.mean(errors):+.1f}% |")
    every = [e for errors in by_folder.values() for e in errors]
    print(f"| all | {len(every)} | {100 * statistics.median(map(abs, every)):.1f}% | {100 * statistics.mean(every):+.1f}% |")
    print(f"median error of all: {100 * statistics.median(every):+.1f}%")
    if breakdown:
        print("\n| folder | run | measured ms | predicted ms | compute | exposed comm | host | (measured - compute) / "
              "(comm + bubble + host) |\n|---|---|---:|---:|---:|---:|---:|---:|")
        print("\n".join(lines))


if __name__ == "__main__":
    flags = ("--held-out", "--breakdown")
    args = [a for a in sys.argv[1:] if a not in flags]
    settings = [a for i, a in enumerate(args) if i == 0 or ("=" in a and not Path(a).exists())]
    dirs = [a for a in args if a not in settings]
    main(settings, dirs or ["results"], held_out="--held-out" in sys.argv[1:], breakdown="--breakdown" in sys.argv[1:])

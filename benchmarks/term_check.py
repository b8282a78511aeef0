"""The prediction's compute terms against the kernels of profiled steps: for every recorded run with a profile
(``metrics.profile_steps``), rank 0's kernel milliseconds a step by kind beside the term that predicts them
(bench/plan/predict.py ``compute_parts``, shipped calibration), and per GPU and model the median of measured /
predicted for each.  Why: the fit sees only whole steps, so a term can carry time that belongs to another (the
matmul term on one H100, results/2026-12-06-h100x1-tight-edge); this says which term is off, and on what.

    python benchmarks/term_check.py results/ [--runs]

Kinds (bench/metrics/profile.py): matmul, attention, optimizer, other (elementwise, copies, the loss).  Records
written before 2026-12-06 (826bd85) count the loss' softmax kernels as attention: their attention is high and their
other low by as much.  Steps with communication are left out (overlap makes kernel time and step time differ).
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from bench.calibrate import replan
from bench.plan.predict import compute_parts, device_hardware, load_calibration, terms
from bench.run.recorded import result_folders
from multirun_analysis.prediction import recorded_hardware

KINDS = ("matmul", "attention", "other", "optimizer")


def measured(run: dict) -> dict | None:
    """Rank 0's kernel ms a profiled step by kind, or None (no profile, or NCCL kernels in it)."""
    prof = run.get("profile")
    prof = prof[0] if isinstance(prof, list) and prof else prof
    ms = (prof or {}).get("kernel_ms_per_step") or {}
    if not ms.get("matmul") or ms.get("communication"):
        return None
    return {k: float(ms.get(k, 0.0)) for k in KINDS}


def kinds_ms(parts: dict) -> dict:
    """The prediction's compute parts (``compute_parts``, seconds) as the profile's kernel kinds, in ms."""
    return {"matmul": parts["matmul"] * 1e3, "attention": parts["attention"] * 1e3,
            "other": (parts["elementwise"] + parts["device_bytes"]) * 1e3, "optimizer": parts["optimizer"] * 1e3}


def predicted(run: dict, hw, k: dict) -> dict:
    """The same kinds from the prediction's compute parts on the run's recorded hardware ``hw``, in ms."""
    plan = replan(run)
    return kinds_ms(compute_parts(terms(plan, device_hardware(plan, hw)), k))


def main(argv: list[str]) -> None:
    show_runs = "--runs" in argv
    dirs = [Path(a) for a in argv if not a.startswith("--")] or [Path("results")]
    k = load_calibration()["constants"]
    groups: dict[tuple, list] = defaultdict(list)
    if show_runs:
        print("| folder | model | strategy | ws | precision | " + " | ".join(f"{x} ms (pred)" for x in KINDS) + " |")
        print("|---|---|---|---:|---|" + "---:|" * len(KINDS))
    for folder in result_folders(dirs):
        for run in json.loads((folder / "runs.json").read_text()):
            if run.get("status") != "completed" or (m := measured(run)) is None:
                continue
            hw = recorded_hardware(run)
            try:
                p = predicted(run, hw, k)
            except Exception:  # no longer re-plannable under the current code
                continue
            r = run["run"]
            groups[(hw.name, r["model"])].append((m, p))
            if show_runs:
                cells = " | ".join(f"{m[x]:.1f} ({p[x]:.1f})" for x in KINDS)
                row = f"{folder.name} | {r['model']} | {r['strategy']} | {r['world_size']} | {r['precision']}"
                print(f"| {row} | {cells} |")
    print("\n| GPU | model | runs | " + " | ".join(f"{x}: measured / predicted" for x in KINDS) + " |")
    print("|---|---|---:|" + "---:|" * len(KINDS))
    for (gpu, model), rows in sorted(groups.items()):
        ratios = [statistics.median(m[x] / p[x] for m, p in rows if p[x] > 0.05) if any(p[x] > 0.05 for _, p in rows)
                  else float("nan") for x in KINDS]
        print(f"| {gpu} | {model} | {len(rows)} | " + " | ".join(f"{v:.2f}" for v in ratios) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])

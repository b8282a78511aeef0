"""Where a profiled step's time goes: compute, communication, their overlap, idle.

Runs with ``metrics.profile_steps=k`` record, per rank, ``profile[r].breakdown_ms_per_step``
(computed from the rank's trace ``trace_rank{r}.json.gz``; definitions in
bench/metrics/trace.py).  Per run, ``profile.<part>_ms`` is the **mean over the ranks** that
have a breakdown (``profile.n_ranks`` of them) of that part in ms per profiled step; the
summary takes the median over repeats (``prof_<part>_ms``).  The plot stacks the four
disjoint parts, which add up to the wall time per profiled step:

  compute only          = compute - overlapped
  overlapped            = communication overlapped with compute
  exposed communication = communication - overlapped
  idle                  = wall - union(compute, communication)
"""
from __future__ import annotations

import math

import pandas as pd

from multirun_analysis.tables import md_table

PARTS = ("compute", "communication", "overlapped", "idle", "wall")
STACK = (("compute only", "#4C72B0"), ("overlapped", "#8172B3"), ("exposed communication", "#DD8452"),
         ("idle", "#BBBBBB"))
# summary column <- runs column (median over repeats); summarize.MEASURES takes these
MEASURES = {f"prof_{p}_ms": (f"profile.{p}_ms", False) for p in PARTS}
TABLE_MD = [("model", "model", str), ("label", "strategy", str), ("world_size", "GPUs", "{:g}"),
            ("prof_wall_ms", "wall ms/step", "{:,.1f}"), ("prof_compute_ms", "compute", "{:,.1f}"),
            ("prof_communication_ms", "communication", "{:,.1f}"),
            ("prof_overlapped_ms", "overlapped", "{:,.1f}"), ("prof_idle_ms", "idle", "{:,.1f}"),
            ("prof_exposed_pct", "exposed comm %", "{:.1f}")]


def run_columns(m: dict) -> dict:
    """The ``profile.*`` columns of one run (metrics.json); empty when it was not profiled."""
    profs = m.get("profile") if isinstance(m.get("profile"), list) else []
    bs = [p["breakdown_ms_per_step"] for p in profs
          if isinstance(p, dict) and isinstance(p.get("breakdown_ms_per_step"), dict)]
    if not bs:
        return {}
    out = {}
    for part in PARTS:
        xs = [b.get(part) for b in bs if isinstance(b.get(part), (int, float))]
        out[f"profile.{part}_ms"] = sum(xs) / len(xs) if xs else math.nan
    sources = sorted({str(p.get("breakdown_source")) for p in profs if isinstance(p, dict)
                      and p.get("breakdown_source")})
    out["profile.n_ranks"] = len(bs)
    out["profile.breakdown_source"] = ", ".join(sources) or None
    return out


def profiled(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary rows that have a breakdown, with ``prof_exposed_pct`` (exposed communication
    as % of the wall time per step)."""
    if summary is None or summary.empty or "prof_wall_ms" not in summary.columns:
        return pd.DataFrame()
    d = summary[pd.to_numeric(summary["prof_wall_ms"], errors="coerce").notna()].copy()
    if d.empty:
        return d
    wall = d["prof_wall_ms"].astype(float)
    d["prof_exposed_pct"] = 100 * (d["prof_communication_ms"].astype(float)
                                   - d["prof_overlapped_ms"].astype(float)) / wall.where(wall > 0)
    return d


def stack_parts(row) -> dict:
    c, m, o, i = (float(row[f"prof_{p}_ms"]) for p in ("compute", "communication", "overlapped", "idle"))
    return {"compute only": c - o, "overlapped": o, "exposed communication": m - o, "idle": i}


def report_section(summary: pd.DataFrame, runs: pd.DataFrame | None = None) -> list[str]:
    """report.md lines: the breakdown table and its plot (nothing when no run was profiled)."""
    d = profiled(summary)
    if d.empty:
        return []
    src = []
    if runs is not None and "profile.breakdown_source" in runs.columns:
        src = sorted({str(x) for x in runs["profile.breakdown_source"].dropna()})
    how = {"cpu_ops": "CPU traces: host operators vs c10d/gloo collectives",
           "gpu_kernels": "GPU traces: kernels vs NCCL kernels"}
    return ["## Where a profiled step's time goes", "",
            "Runs with `metrics.profile_steps=k`: each rank's trace (`trace_rank{r}.json.gz` in the run folder) "
            "split into compute, communication, communication overlapped with compute, and idle — ms per "
            "profiled step, mean over ranks, median over repeats (source: "
            + (", ".join(how.get(s, s) for s in src) or "n/a") + "; definitions: bench/metrics/trace.py). "
            "compute + communication − overlapped + idle = wall; exposed comm % = (communication − "
            "overlapped) / wall. Plot: `time_breakdown.png` (under Plots: one stacked bar per strategy and "
            "GPU count of compute only, overlapped, exposed communication and idle).", "", md_table(d, TABLE_MD)]

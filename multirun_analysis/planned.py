"""A dry-run sweep's answer before any GPU is spent: every planned layout ranked by predicted tokens/s.

Ranking rule, per (model, GPU count, tokens per step): layouts that fit first, then ``tight`` ones (inside the
memory plan's error below the device's memory), each fastest first; layouts over ``memory_budget_gib`` (what
the plan says must be free, ``needed``) or that do not fit are listed after them, unranked.  So a tight or
over-budget layout never ranks above one that fits.  Each row carries its layout, precision and the command
that runs it (the dry run's overrides without ``dry_run``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd

from multirun_analysis import layouts

VERDICT_ORDER = {"yes": 0, "tight": 1, "unknown": 2, "over budget": 3, "no": 4}
RANKED = ("yes", "tight")  # verdicts that get a rank; the others are listed after them


def _plan_records(paths: Iterable) -> list[tuple[dict, str]]:
    """(record, where) of every single dry run's ``plan.json`` and every dry-run sweep's ``plans.json``."""
    out = []
    for path in map(Path, paths):
        files = [path] if path.is_file() else sorted([*path.rglob("plan.json"), *path.rglob("plans.json")])
        for f in files:
            try:
                d = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(d, dict):
                out.append((d, str(f.parent)))
            elif isinstance(d, list):
                out += [(r, f"{f.parent}/{r.get('dir') or r.get('num')}") for r in d if isinstance(r, dict)]
    return out


def command(d: dict) -> Optional[str]:
    """The command that runs a planned layout for real: its overrides (a sweep's record) or its recorded command
    (a single dry run), without ``dry_run`` and the sweep's machinery (bench.spec.commands.rerun_command)."""
    from bench.spec.commands import override_key, rerun_command

    words = d.get("overrides")
    if not isinstance(words, list):
        cmd = (d.get("config") or {}).get("_command") or []
        words = cmd[cmd.index("-m") + 2:] if "-m" in cmd else None
    if not words:
        return None
    return rerun_command([w for w in map(str, words) if override_key(w) != "dry_run"])


def _verdict(mem: dict, budget_gib: Optional[float]) -> str:
    if mem.get("fits") is False:
        return "no"
    if budget_gib is not None and (mem.get("needed_mb") or 0) / 1024 > budget_gib:
        return "over budget"
    return "tight" if mem.get("tight") else ("yes" if mem.get("fits") else "unknown")


def _row(d: dict, where: str, budget_gib: Optional[float]) -> dict:
    from bench.run.runs import run_key

    cfg, mem, pred = d.get("config") or {}, d.get("memory") or {}, d.get("prediction") or {}
    model = cfg.get("model") or {}
    lay = layouts.from_plan_layout(cfg, mem.get("layout") or {})
    return {"run": where, "key": d.get("key") or run_key(cfg), "model": model.get("name"),
            "world_size": cfg.get("world_size"),
            "tokens_per_step": model.get("global_batch", 0) * model.get("seq_len", 0), "strategy": lay["variant"],
            **{c: lay[c] for c in layouts.COLUMNS if c != "variant"}, "layout": layouts.text(lay),
            "fits": _verdict(mem, budget_gib), "predicted_peak_gib": (mem.get("predicted_peak_allocated_mb") or 0) / 1024,
            "needed_gib": (mem.get("needed_mb") or 0) / 1024, "device_memory_gib": mem.get("device_memory_gib"),
            "predicted_tokens_per_s": pred.get("tokens_per_s"),
            "predicted_step_ms": 1000 * pred["step_time_s"] if pred.get("step_time_s") else None,
            "command": command(d)}


def planned(paths: Iterable, memory_budget_gib: Optional[float] = None) -> pd.DataFrame:
    """Every planned layout under ``paths`` (``plan.json`` / ``plans.json``), ranked by the module's rule;
    ``rank`` is 1, 2, ... within each workload for layouts that fit (then tight), empty for the rest."""
    rows = [_row(d, where, memory_budget_gib) for d, where in _plan_records(paths) if d.get("memory")]
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    t["_order"] = t["fits"].map(VERDICT_ORDER)
    t = t.sort_values(["model", "world_size", "tokens_per_step", "_order", "predicted_tokens_per_s"],
                      ascending=[True, True, True, True, False], na_position="last").drop(columns="_order")
    ranked = t["fits"].isin(RANKED)
    t["rank"] = ranked.groupby([t["model"], t["world_size"], t["tokens_per_step"]]).cumsum().where(ranked)
    return t.reset_index(drop=True)


def _error_note() -> str:
    try:
        from bench.plan.predict import load_calibration

        e = load_calibration().get("error") or {}
        return (f" Measured error of such predictions: median {100 * e['median_abs']:.0f}%, 90th percentile "
                f"{100 * e['p90_abs']:.0f}% ({e.get('method')}).")
    except (ImportError, KeyError, TypeError):
        return ""


CELLS = [("rank", "rank", "{:.0f}"), ("model", "model", str), ("world_size", "GPUs", "{:g}"),
         ("strategy", "strategy", str), ("precision", "precision", str), ("layout", "layout", str),
         ("fits", "fits", str), ("predicted_peak_gib", "peak GiB", "{:.1f}"), ("needed_gib", "needed GiB", "{:.1f}"),
         ("predicted_tokens_per_s", "predicted tokens/s", "{:,.0f}"), ("command", "command", lambda c: f"`{c}`")]


def planned_section(t: pd.DataFrame, memory_budget_gib: Optional[float] = None) -> list[str]:
    """report.md's (and the terminal's) predicted ranking of a dry-run sweep, said to be predicted."""
    from multirun_analysis.tables import md_table

    if t is None or t.empty:
        return []
    budget = (f" Layouts needing more than {memory_budget_gib:g} GiB per GPU are `over budget` (unranked)."
              if memory_budget_gib else "")
    return ["## Predicted ranking (dry run: planned, nothing measured)", "",
            "Each planned layout's fit verdict and predicted throughput (bench/plan/predict.py), per model, GPU count "
            "and tokens per step: layouts that fit first, then `tight` ones, each fastest first; layouts that do "
            "not fit are listed, not ranked. layout = tp, pp, dp, micro-batch size x accumulation steps, "
            "recompute; needed = the peak plus the plan's allowance (allocator, CUDA context)." + budget
            + _error_note(), "", md_table(t, CELLS)]

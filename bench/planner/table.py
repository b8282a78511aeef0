"""The planner's answer: each row's runnable command, its numbers, and the table printed and written (CSV, JSON)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from bench.planner.evaluate import Row, error_parts, error_statement, job_cost, mfu
from bench.spec.schema import setting
from bench.strategies.registry import get_spec, grad_reduce_of


def fmt(v: Any) -> str:
    """A value as a Hydra override writes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    return str(v)


def command_overrides(row: Row, base: dict, common: list[str], strategy_set: bool) -> list[str]:
    """The overrides that run a row: the job's own (``common``: the user's keys and the job's size), the strategy,
    and every key the search changed to a value other than the composed default."""
    own = [] if strategy_set else [f"strategy={row.strategy}"]
    for k, v in sorted(row.changes.items()):
        if v != setting(base, k):
            own.append(f"{k}={fmt(v)}")
    return [*common, *own]


# keys a row's layout columns already show (the rest of what the search changed is the row's "knobs")
SHOWN = {"strategy.tp", "strategy.pp", "strategy.cp", "strategy.micro_batch_size", "strategy.microbatches", "recompute",
         "precision", "compile"}


def knobs(row: Row, base: dict) -> str:
    """The strategy and every knob the search set to other than its composed default, beyond the layout columns
    (ZeRO's stage, FSDP2's reshard and unit size, offload, ...): what tells two rows of one layout apart."""
    always = set(get_spec(row.strategy).search_bases)  # ZeRO's stage: a row's identity even at its default
    own = [f"{k.split('.', 1)[-1]}={fmt(v)}" for k, v in sorted(row.changes.items())
           if k not in SHOWN and (v != setting(base, k) or k in always)]
    return " ".join([row.strategy, *own])


def record(row: Row, rank: int, base: dict, common: list[str], strategy_set: bool,
           train_tokens: Optional[float], flags: tuple[str, ...] | list[str] = ()) -> dict:
    """One row of the answer as plain values (the CSV / JSON record)."""
    days, gpu_hours = job_cost(row, train_tokens)
    mem, lay = row.memory, row.memory["layout"]
    u = mfu(row)
    parts = list(error_parts(row.prediction)) if row.prediction else None
    overrides = command_overrides(row, base, common, strategy_set)
    return {
        "rank": rank, "verdict": row.verdict, "strategy": row.strategy,
        "tp": lay["tp"], "pp": lay["pp"], "cp": lay.get("cp", 1), "dp": lay["dp"],
        "micro_batch_size": lay["micro_batch_size"], "grad_accum": lay["microbatches"], "recompute": lay["recompute"],
        "precision": row.plan.run.precision,
        "compile": row.plan.run.compile, "grad_reduce": grad_reduce_of(row.plan, row.memory["parameters_on_rank"]),
        "knobs": knobs(row, base),
        "tokens_per_s": round(row.tokens_per_s) if row.tokens_per_s else None,
        "mfu": round(u, 4) if u is not None else None,
        "peak_gib": round(mem["predicted_peak_allocated_mb"] / 1024, 1),
        "needed_gib": round(mem["needed_mb"] / 1024, 1),
        "device_gib": mem.get("device_memory_gib"),
        "days": round(days, 2) if days is not None else None,
        "gpu_hours": round(gpu_hours) if gpu_hours is not None else None,
        "error": error_statement(parts) if parts else None, "error_parts": parts,
        "command": " ".join(["python -m bench", *flags, *overrides]), "overrides": overrides,
        "changes": {k: v for k, v in row.changes.items()},
    }


def _num(v: Any, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def same_setting(records: list[dict]) -> list[dict]:
    """One row per distinct setting: rows that plan the same layout to the same memory and throughput under
    different strategy names (megatron, tp with tp=1, pp with pp=1 run one megatron-core layout) are one row,
    the first kept with the others named in its ``also``; ranks are renumbered."""
    out, seen = [], {}
    for r in records:
        key = (r["tp"], r["pp"], r["cp"], r["dp"], r["micro_batch_size"], r["grad_accum"], r["recompute"],
               r["precision"], r["compile"], r["tokens_per_s"], r["peak_gib"], r["needed_gib"], r["verdict"],
               tuple(r["knobs"].split(" ")[1:]))
        if key in seen:
            seen[key].setdefault("also", []).append(r["strategy"])
            continue
        seen[key] = r
        out.append({**r, "rank": len(out) + 1})
    return out


def error_notes(records: list[dict]) -> list[str]:
    """The printed rows' error statements, each once with the ranks it applies to.  Where every row quotes one
    measured error (its case's, or its link regime's), that sentence is printed once and, by rank, only what differs:
    where the groups live and the error on the recorded runs with the layout's features."""
    rows = [r for r in records if r["error"]]
    cases = {r["error_parts"][1] for r in rows}
    shared = len(cases) == 1 and len(rows) > 1
    by_text: dict[str, list[int]] = {}
    for r in rows:
        where, _, layout = r["error_parts"]
        by_text.setdefault(where + layout if shared else r["error"], []).append(r["rank"])
    if len(by_text) == 1:
        return [f"the prediction's error, the same for every row: {rows[0]['error']}"]
    lead = "  " if shared else "the prediction's error, "
    notes = [f"{lead}rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)}: {text}" for text, ranks in by_text.items()]
    return ([f"the prediction's error, every row: {cases.pop()}; by rank, where its groups live and the error on the "
             "recorded runs with its layout's features:"] if shared else []) + notes


def _ranges(ranks: list[int]) -> str:
    """1, 2, 3, 5 -> '1-3, 5'."""
    parts, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            parts.append(f"{start}-{a}" if a != start else str(a))
            start = b
    return ", ".join(parts)


def lines(records: list[dict], top: int) -> list[str]:
    """The prediction's error statements once each, then the table of the first ``top`` rows."""
    shown = records[:top]
    head = (f"{'rank':>4}  {'verdict':<12} {'precision':<14} {'recompute':<9} {'tp pp cp dp mb x accum':<22} "
            f"{'tokens/s':>10} {'MFU':>6} "
            f"{'peak':>6} {'needed':>7} {'days':>8} {'GPU-hours':>10}  {'strategy and knobs':<40} command")
    out = [*error_notes(shown), head, "-" * len(head)]
    for r in shown:
        lay = f"{r['tp']} {r['pp']} {r['cp']} {r['dp']} {r['micro_batch_size']} x {r['grad_accum']}"
        also = f" (= {', '.join(r['also'])})" if r.get("also") else ""
        prec = r["precision"] + (" compiled" if r["compile"] else "")
        out.append(f"{r['rank']:>4}  {r['verdict']:<12} {prec:<14} {r['recompute']:<9} {lay:<22} "
                   f"{_num(r['tokens_per_s'], ',.0f'):>10} "
                   f"{_num(r['mfu'] and 100 * r['mfu'], '.1f'):>5}% {r['peak_gib']:>5.1f}G {r['needed_gib']:>6.1f}G "
                   f"{_num(r['days'], ',.1f'):>8} {_num(r['gpu_hours'], ',.0f'):>10}  {r['knobs'] + also:<40} "
                   f"{r['command']}")
    return out


def write(out_dir: Path, header: dict, records: list[dict]) -> tuple[Path, Path]:
    """plan.csv (one row a layout) and plan.json (the question, the counts and the rows) in ``out_dir``."""
    import pandas as pd

    from bench.jsonio import write_json_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / "plan.csv", out_dir / "plan.json"
    pd.DataFrame([{k: v for k, v in r.items() if k not in ("overrides", "changes", "error_parts")}
                  for r in records]).to_csv(
        csv_path, index=False)
    write_json_atomic(json_path, json.loads(json.dumps({**header, "rows": records}, default=str)))
    return csv_path, json_path

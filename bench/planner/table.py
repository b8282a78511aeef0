"""The planner's answer: each row's runnable command, its numbers, and the table printed and written (CSV, JSON)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from bench.planner.evaluate import Row, error_statement, get_key, job_cost, mfu


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
        if v != get_key(base, k):
            own.append(f"{k}={fmt(v)}")
    return [*common, *own]


def record(row: Row, rank: int, base: dict, common: list[str], strategy_set: bool,
           train_tokens: Optional[float]) -> dict:
    """One row of the answer as plain values (the CSV / JSON record)."""
    days, gpu_hours = job_cost(row, train_tokens)
    mem, lay = row.memory, row.memory["layout"]
    u = mfu(row)
    overrides = command_overrides(row, base, common, strategy_set)
    return {
        "rank": rank, "verdict": row.verdict, "strategy": row.strategy,
        "tp": lay["tp"], "pp": lay["pp"], "dp": lay["dp"], "micro_batch_size": lay["micro_batch_size"],
        "grad_accum": lay["microbatches"], "recompute": lay["recompute"], "precision": row.plan.cfg["precision"],
        "compile": row.plan.cfg["compile"],
        "tokens_per_s": round(row.tokens_per_s) if row.tokens_per_s else None,
        "mfu": round(u, 4) if u is not None else None,
        "peak_gib": round(mem["predicted_peak_allocated_mb"] / 1024, 1),
        "needed_gib": round(mem["needed_mb"] / 1024, 1),
        "device_gib": mem.get("device_memory_gib"),
        "days": round(days, 2) if days is not None else None,
        "gpu_hours": round(gpu_hours) if gpu_hours is not None else None,
        "error": error_statement(row.prediction) if row.prediction else None,
        "command": " ".join(["python -m bench", *overrides]), "overrides": overrides,
        "changes": {k: v for k, v in row.changes.items()},
    }


def _num(v: Any, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def lines(records: list[dict], top: int) -> list[str]:
    """The printed table: the first ``top`` rows, then the prediction's error statement once when it is shared."""
    head = (f"{'rank':>4}  {'verdict':<12} {'precision':<9} {'tp pp dp mb x accum':<20} {'tokens/s':>10} {'MFU':>6} "
            f"{'peak':>6} {'needed':>7} {'days':>8} {'GPU-hours':>10}  command")
    out = [head, "-" * len(head)]
    for r in records[:top]:
        lay = f"{r['tp']} {r['pp']} {r['dp']} {r['micro_batch_size']} x {r['grad_accum']}"
        out.append(f"{r['rank']:>4}  {r['verdict']:<12} {r['precision']:<9} {lay:<20} "
                   f"{_num(r['tokens_per_s'], ',.0f'):>10} "
                   f"{_num(r['mfu'] and 100 * r['mfu'], '.1f'):>5}% {r['peak_gib']:>5.1f}G {r['needed_gib']:>6.1f}G "
                   f"{_num(r['days'], ',.1f'):>8} {_num(r['gpu_hours'], ',.0f'):>10}  {r['command']}")
    errors = {r["error"] for r in records[:top] if r["error"]}
    if len(errors) == 1:
        out.append(f"the prediction's error, the same for every row: {errors.pop()}")
    else:
        out += [f"  rank {r['rank']}: {r['error']}" for r in records[:top] if r["error"]]
    return out


def write(out_dir: Path, header: dict, records: list[dict]) -> tuple[Path, Path]:
    """plan.csv (one row a layout) and plan.json (the question, the counts and the rows) in ``out_dir``."""
    import pandas as pd

    from bench.jsonio import write_json_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / "plan.csv", out_dir / "plan.json"
    pd.DataFrame([{k: v for k, v in r.items() if k not in ("overrides", "changes")} for r in records]).to_csv(
        csv_path, index=False)
    write_json_atomic(json_path, json.loads(json.dumps({**header, "rows": records}, default=str)))
    return csv_path, json_path

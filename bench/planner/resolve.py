"""One run's ``strategy.micro_batch_size=auto`` and ``tuning=best``, resolved by the planner's search.

Validation (bench/run/config.py) resolves ``auto`` by memory alone: the largest micro-batch that fits.  One layer up
(bench/launch/job.py calls :func:`choose`), where a prediction may be made, this search takes the validated plan and
chooses, for the strategy and layout the user named, the fastest predicted setting that fits without being
tight among the micro-batch (with ``auto``), recompute and the strategy's knobs the memory plan counts (FSDP2's
reshard and unit size, say), and, where none fits, its fallback knobs (offload: bench/planner/search.py
``fallbacks``, as the planner tries them), keeping every key the user set (and the precision: fp8 only when
asked for).  With
nothing to predict for (a CPU run without hardware=<preset>) the plan stays as validation left it.
"""
from __future__ import annotations

import copy
import logging
from typing import Iterable, Optional

from bench.run.config import validate
from bench.planner.evaluate import NO_FIT, Evaluator, Row
from bench.planner.search import (MICRO_BATCH, best_micro_batch, fallbacks, improve_knobs, recomputes,
                                  tunable_knobs)
from bench.plan.predict import device_hardware
from bench.spec.schema import BenchConfig, Plan, setting
from bench.strategies.registry import get_spec
from bench.run.tuning_profiles import with_search

log = logging.getLogger("bench")


def _fixed(plan: Plan, explicit: Iterable[str]) -> set[str]:
    """What the search keeps: the user's keys, those tuning=best kept as set, and the micro-batch unless auto."""
    fixed = set(explicit) | {"precision", "compile", "strategy.tp", "strategy.pp"}
    fixed |= set((plan.tuning or {}).get("kept") or {})
    if plan.micro_batch_auto is None:
        fixed.add(MICRO_BATCH)
    else:  # set, to auto: that is, to be chosen
        fixed.discard(MICRO_BATCH)
    return fixed


def _describe(row: Row, base: BenchConfig) -> str:
    lay = row.memory["layout"]
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(row.changes.items())
                      if k not in (MICRO_BATCH, "recompute") and v != setting(base, k))
    speed = f"{row.tokens_per_s:,.0f} tokens/s predicted" if row.tokens_per_s else "no prediction"
    return (f"micro-batch {lay['micro_batch_size']} x {lay['microbatches']}, recompute={lay['recompute']}, "
            f"precision={row.plan.run.precision} (as set)"
            f"{', ' + knobs if knobs else ''}: {speed}, {row.verdict} ({row.memory['needed_mb'] / 1024:.1f} GiB "
            f"needed of {row.memory['device_memory_gib']:.1f})")


def choose(plan: Plan, explicit: Iterable[str] = (), gpus: Optional[int] = None) -> Optional[dict]:
    """{changes, chosen, runner_up} of the fastest predicted setting that fits (module docstring); None when there
    is nothing to choose (neither auto nor tuning=best) or no prediction to choose by."""
    if plan.micro_batch_auto is None and not plan.tuning:
        return None
    try:
        device_hardware(plan)
    except ValueError:  # no GPU to predict for: validation's choice stands
        return None
    base = copy.deepcopy(plan.cfg)
    base["tuning"] = "default"  # the profile's settings are in the config already
    fixed = _fixed(plan, explicit)
    ev = Evaluator(gpus)
    spec = get_spec(plan.strategy.name)
    rows: list[Row] = []
    for group in recomputes(fixed):
        row = best_micro_batch(ev, base, group, fixed)
        if row is not None:
            rows += improve_knobs(ev, base, row, fixed, tunable_knobs(spec, fixed))[1]
    rows = sorted({id(r): r for r in rows}.values(), key=Row.rank_key)
    # where no setting fits without them, the strategy's fallback knobs (offload), as the planner tries them
    rows = [r for r in fallbacks(ev, {spec.name: base}, rows, fixed) if r.verdict != NO_FIT and r.tokens_per_s]
    rows.sort(key=Row.rank_key)
    if not rows:
        return None
    best = rows[0]
    runner = next((r for r in rows[1:] if r.plan.run != best.plan.run), None)
    return {"changes": best.changes, "verdict": best.verdict, "chosen": _describe(best, plan.run),
            "runner_up": _describe(runner, plan.run) if runner else "none (no other setting fits)",
            "searched": ev.planned}


def apply(plan: Plan, choice: dict, gpus: Optional[int] = None) -> Plan:
    """The plan with the chosen changes, validated again as the run itself (records of tuning and auto kept)."""
    from bench.planner.evaluate import set_key

    c = copy.deepcopy(plan.cfg)
    tuning = plan.run.tuning
    c["tuning"] = "default"
    for k, v in choice["changes"].items():
        set_key(c, k, v)
    new = validate(c, gpus=gpus, explicit=list(choice["changes"]))
    new.run.tuning = tuning
    record = {k: choice[k] for k in ("chosen", "runner_up", "changes")}
    new.tuning = {**with_search(plan.tuning, get_spec(plan.strategy.name), choice["changes"]), "planner": record} \
        if plan.tuning else None
    if plan.micro_batch_auto is not None:
        new.micro_batch_auto = {**plan.micro_batch_auto, "chosen": new.micro_batch_size, "grad_accum": new.grad_accum,
                                "reason": f"the fastest predicted that fits (bench/planner): {choice['chosen']}",
                                "planner": record}
    return new


def resolved(plan: Plan, explicit: Iterable[str] = (), gpus: Optional[int] = None, run: str = "") -> Plan:
    """The plan a run (bench/launch/job.py) or a sweep's job runs: with the choice applied, and the choice and the
    runner-up logged (naming ``run``, the run's folder: a sweep's lines interleave); the plan itself when there is
    nothing to choose."""
    choice = choose(plan, list(explicit), gpus)
    if choice is None:
        return plan
    log.info("planner%s: chose %s; runner-up %s (%d settings planned)", f" ({run})" if run else "",
             choice["chosen"], choice["runner_up"], choice["searched"])
    return apply(plan, choice, gpus)

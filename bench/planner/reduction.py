"""The precision each row's gradients are reduced in, and what 16 bit would buy a strategy that reduces in fp32.

By default ZeRO (DeepSpeed's own 16-bit mode) reduces gradients in bf16, while DDP, FSDP2 and Megatron reduce them
in fp32 (``StrategySpec.half_reduction`` names the knob that halves them). On a slow link that alone can order the
strategies: over sockets on 4 x H100 (the probe of results/2026-11-28-h100x4-slow-links-planner), the planner's best
DDP row for Llama 3.2 1B is predicted at 5,920 tokens/s, and with ``strategy.comm_hook=bf16_compress`` at 11,347. So a ranking there compares
strategies at different precisions of the gradient sums. The search does not try 16-bit reductions: they change
numerics, which is the user's choice. The planner says where the rows differ. It also names each fp32 strategy's
16-bit knob where its best row would gain at least NOTE_GAIN, with the predicted tokens/s.
"""
from __future__ import annotations

from typing import Callable, Optional

from bench.planner.evaluate import Evaluator, Row
from bench.strategies.registry import get_spec

# a gain below this is within the prediction's own error on slow links (held out, median 5-8%): not worth a change of
# the gradients' precision
NOTE_GAIN = 0.10


def reduced_in(row: Row) -> Optional[str]:
    """"fp32" or "16-bit": what the row's data-parallel reduction sends a gradient element as (its strategy's traffic,
    ``grad_elem``); None without a reduction (one replica)."""
    elem = get_spec(row.strategy).traffic(row.plan, float(row.memory["parameters_on_rank"])).get("grad_elem")
    return None if not elem else "fp32" if elem >= 4 else "16-bit"


def notes(ev: Evaluator, bases: dict[str, dict], rows: list[Row], fixed: set[str],
          rank_of: Callable[[Row], Optional[int]] = lambda row: None) -> list[str]:
    """Lines for the answer, from the ranked ``rows``: which strategies' best rows reduce gradients in 16 bit and which
    in fp32, where both occur; and for each fp32 one whose 16-bit knob the user did not set, that knob where it
    would gain at least NOTE_GAIN (its best row planned again with it; ``rank_of``: that row's rank in the answer)."""
    best: dict[str, Row] = {}
    for r in rows:
        if r.tokens_per_s and r.strategy not in best:
            best[r.strategy] = r
    kinds = {s: reduced_in(r) for s, r in best.items()}
    out = []
    if {"fp32", "16-bit"} <= set(kinds.values()):
        names = {k: ", ".join(s for s, v in kinds.items() if v == k) for k in ("16-bit", "fp32")}
        out.append(f"gradients are reduced in 16 bit by {names['16-bit']} and in fp32 by {names['fp32']} (each at its "
                   "default): the ranking compares them at different precisions of the gradient sums")
    for s, r in best.items():
        knob = get_spec(s).half_reduction
        if kinds[s] != "fp32" or knob is None or knob[0] in fixed:
            continue
        half = ev(bases[s], {**r.changes, knob[0]: knob[1]})
        if half is not None and half.tokens_per_s and half.tokens_per_s >= (1 + NOTE_GAIN) * r.tokens_per_s:
            rank = rank_of(r)
            out.append(f"{s}: with {knob[0]}={knob[1]} (16-bit gradient sums, half the bytes) its best row"
                       f"{f' (rank {rank})' if rank else ''} is predicted at {half.tokens_per_s:,.0f} tokens/s against "
                       f"{r.tokens_per_s:,.0f} (+{half.tokens_per_s / r.tokens_per_s - 1:.0%}); not searched, as it "
                       "changes numerics: add it to that row's command to run it")
    return out

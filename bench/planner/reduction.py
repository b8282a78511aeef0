"""The precision each row's gradients are summed in, and what 16 bit would buy a strategy that sums them in fp32.

At their defaults ZeRO sums gradients in 16 bit (DeepSpeed's own bf16; under its torch_autocast at stages 1-3, the
blocks' Linear gradients: "mixed"), while DDP, FSDP2 and Megatron sum them in fp32. On a slow link that alone can
order the strategies: over sockets on 4 x H100 (the probe of results/2026-11-28-h100x4-slow-links-planner), the
planner's best DDP row for Llama 3.2 1B is predicted at 5,920 tokens/s, and with ``strategy.comm_hook=bf16_compress`` at
11,347. So a ranking there compares strategies at different precisions of the gradient sums. The search does not try
16-bit reductions: they change numerics, which is the user's choice (``grad_reduce=fp32 | 16bit`` plans every
strategy at one, bench/run/grad_reduce.py). The planner says where the rows differ. It also names each fp32
strategy's 16-bit knob where its best row would gain at least NOTE_GAIN, with the predicted tokens/s.
"""
from __future__ import annotations

from typing import Callable, Optional

from bench.planner.evaluate import Evaluator, Row
from bench.run.grad_reduce import knob_of
from bench.strategies.registry import get_spec, grad_reduce_of

# a gain below this is within the prediction's own error on slow links (held out, median 5-8%): not worth a change of
# the gradients' precision
NOTE_GAIN = 0.10
KINDS = {"16bit": "in 16 bit", "mixed": "partly in 16 bit (the blocks' Linear gradients)", "fp32": "in fp32"}


def notes(ev: Evaluator, bases: dict[str, dict], rows: list[Row], fixed: set[str],
          rank_of: Callable[[Row], Optional[int]] = lambda row: None) -> list[str]:
    """Lines for the answer, from the ranked ``rows``: in what precision each strategy's best row sums gradients,
    where they differ; and for each fp32 one whose reduction the user did not set (grad_reduce or its own knob), its
    16-bit knob where that would gain at least NOTE_GAIN (its best row planned again with it; ``rank_of``: that row's
    rank in the answer)."""
    best: dict[str, Row] = {}
    for r in rows:
        if r.tokens_per_s and r.strategy not in best:
            best[r.strategy] = r
    kinds = {s: grad_reduce_of(r.plan, r.memory["parameters_on_rank"]) for s, r in best.items()}
    out = []
    if len(set(kinds.values()) - {None}) > 1:
        said = [f"{KINDS[k]} by {', '.join(s for s, v in kinds.items() if v == k)}"
                for k in KINDS if k in kinds.values()]
        out.append(f"gradients are summed {'; '.join(said)} (each at its default): the ranking compares them at "
                   "different precisions of the gradient sums; grad_reduce=fp32 or grad_reduce=16bit plans them at one")
    for s, r in best.items():
        if kinds[s] != "fp32" or "16bit" not in get_spec(s).grad_reduce or "grad_reduce" in fixed:
            continue
        key, value = knob_of(get_spec(s), "16bit", r.plan.run.precision)
        if key in fixed:
            continue
        half = ev(bases[s], {**r.changes, key: value})
        if half is not None and half.tokens_per_s and half.tokens_per_s >= (1 + NOTE_GAIN) * r.tokens_per_s:
            rank = rank_of(r)
            out.append(f"{s}: with {key}={value} (16-bit gradient sums, half the bytes) its best row"
                       f"{f' (rank {rank})' if rank else ''} is predicted at {half.tokens_per_s:,.0f} tokens/s against "
                       f"{r.tokens_per_s:,.0f} (+{half.tokens_per_s / r.tokens_per_s - 1:.0%}); not searched, as it "
                       "changes numerics: add it to that row's command to run it")
    return out

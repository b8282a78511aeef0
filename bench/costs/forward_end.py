"""The end of an eager forward under torch.autocast over fp32 weights, inside the loss: a moment of the memory plan
(bench/plan/memory_model.py) that can be larger than backward's start.

torch.autocast caches the 16-bit copy it makes of each fp32 leaf weight (``cached_cast``) until the autocast
context exits, which bench's step does after the loss (bench/strategies/torch_native.py), so every matmul weight's copy
is alive at the end of the forward, those of checkpointed blocks too (``recompute=full`` saves none of them for
backward, so they are gone once backward starts).  Beside them, while the loss' forward runs (bench/models/model.py
``lm_loss``): the 16-bit logits the head returned, their fp32 cast and the log-softmax output (2 + 4 + 4 B per logit),
where backward's start holds 12 B per logit and only the head's copy.  Under full recompute of a deep model the blocks'
copies outweigh the 2 B per logit: Gemma-2B (18 blocks, 256k vocabulary, 4096 tokens) holds 1.7 GiB more at the
forward's end than at backward's start (torch's MemTracker: tests/test_memory_tracker.py).  Compiled forwards cast
inside the graph (no cache): not counted."""
from __future__ import annotations

from bench.spec.schema import Plan

# the loss' forward (torch's cross entropy, a 16-bit head's output): the logits, their fp32 cast, log-softmax's output
FORWARD_LOSS_BYTES_PER_LOGIT = 2 + 4 + 4


def forward_end_bytes(plan: Plan, copies: float, logit_elements: float) -> float:
    """Beside the saved activations at the end of the forward: autocast's cached copies (``copies``: every matmul
    weight's on the rank) and the loss' forward buffers over ``logit_elements`` logits; 0 where no cache holds them
    (fp32 or 16-bit weights: ``copies`` is 0; fp8; compiled)."""
    if not copies or plan.run.compile or plan.run.precision not in ("bf16", "fp16"):
        return 0.0
    return copies + FORWARD_LOSS_BYTES_PER_LOGIT * logit_elements

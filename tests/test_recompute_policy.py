"""recompute=op's policy (bench/parallel/ac.py op_policy) under either way torch replays it: torch 2.11 asks the policy
again in the recomputation (``ctx.is_recompute=True``) and takes a saved output for every op it says to save, so the
recomputation's choices must be the forward's, position by position; later torch replays the forward's choices."""
from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from bench.parallel.ac import op_policy

MM, SDPA = torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default
# one llama block as the policy sees it: q, k, v, attention, o, gate, up, down (7 matmuls: an odd count)
BLOCK = (MM, MM, MM, SDPA, MM, MM, MM, MM)


def _choices(policy, is_recompute: bool) -> list:
    ctx = SelectiveCheckpointContext(is_recompute=is_recompute)
    return [policy(ctx, func) for func in BLOCK]


def test_the_recomputation_asks_for_what_the_forward_saved_position_by_position():
    policy = op_policy()
    forward = _choices(policy, False)
    assert [c == CheckpointPolicy.MUST_SAVE for c in forward] == [True, False, True, True, False, True, False, True]
    assert _choices(policy, True) == forward  # torch 2.11: asked again after the forward's 7 matmuls
    assert _choices(op_policy(), False) == forward  # the next block's forward starts its own count

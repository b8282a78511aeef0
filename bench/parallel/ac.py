"""Activation recomputation (``recompute``): keep less of the forward for backward, recompute it.

* ``full``: each transformer block is checkpointed (torch.utils.checkpoint, non-reentrant): only
  its input is kept, and its forward runs again in backward (+1 block forward per step: the
  memory plan counts only block inputs, the FLOPs count the extra forward as hardware FLOPs).
  ``recompute_every=k``: blocks 0, k, 2k, ... of a stage only (torchtitan's selective layer
  checkpointing): memory and the extra forward between none and full.
* ``selective``: the attention core (softmax(QK^T)V) is recomputed in backward (Korthikanti et
  al. 2022's selective recomputation, Megatron's ``recompute_granularity=selective``).  Under
  scaled_dot_product_attention's fused kernels the s x s scores are never stored anyway, so it
  saves little more than the attention output.
"""
from __future__ import annotations

import torch.nn as nn


def apply_ac(model: nn.Module, mode: str, every: int = 1) -> dict:
    if mode == "none":
        return {}
    if mode == "full":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, (k, block) in enumerate(list(model.blocks.items())):
            if i % every == 0:
                model.blocks[k] = checkpoint_wrapper(block, preserve_rng_state=False)
        which = "every transformer block" if every == 1 else f"every {every}th transformer block (0, {every}, ...)"
        return {"recompute": f"full: {which} checkpointed (its forward re-run in backward)"}
    if mode == "selective":
        for block in model.blocks.values():
            block.attn.recompute_core = True
        return {"recompute": "selective: the attention core re-run in backward"}
    raise ValueError(f"unknown recompute mode {mode!r}")


def apply_loss_chunks(model: nn.Module, chunks: int) -> dict:
    """``loss_chunks=k`` > 1: the head computes the loss in k checkpointed chunks of tokens (bench/models/model.py
    ``Head``): one chunk's logits and fp32 loss buffers alive at a time, the head's matmul run again in backward."""
    if chunks == 1:
        return {}
    model.head.loss_chunks = chunks
    return {"loss_chunks": chunks, "loss": f"the head's matmul and fp32 cross entropy in {chunks} checkpointed chunks "
                                           "of tokens (one chunk's logits alive at a time; its forward re-run in "
                                           "backward), the chunks' sums averaged over every token"}

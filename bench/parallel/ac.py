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
* ``op``: torchtitan's op-level selective checkpointing (``selective_ac_option=op``): every block
  checkpointed under a policy that saves the outputs of the expensive ops (``op_policy``) and
  recomputes the rest (norms, RoPE, activations, casts) from them in backward.  Every second matmul
  of a block is recomputed too (torchtitan's trade: half the matmul outputs kept, a third of the
  block's matmul FLOPs again); attention is never run twice.

``offload_activations`` (apart from the mode, composing with it): each block's saved tensors (its
activations, autocast's weight copies it saves; under ``full`` only its input) go to pinned host memory
in the forward and come back for its backward (torch's ``offload_wrapper``, ``save_on_cpu``).  The copies
run on the compute stream, so their time is not hidden: the device's memory for the host link's time.
"""
from __future__ import annotations

import torch
import torch.nn as nn

OP_DESCRIPTION = "op: matmul outputs (every second mm recomputed) and attention saved, the rest recomputed"


def _op_sets() -> tuple[set, set]:
    """(matmuls, other ops whose outputs are saved) as bench's model dispatches them, eager and compiled: nn.Linear
    is aten.mm (no bias) or aten.addmm (bias), torchao's float8 Linear aten._scaled_mm; the fused attention kernels
    (CUDA flash / memory-efficient / cuDNN, the CPU flash one); tensor parallelism's reduce-scatter (its output is
    1/tp of the partial sums it reduces; all-gathers are re-issued instead, as torchtitan); max (float8's amax)."""
    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    matmuls = {aten.mm.default, aten.addmm.default, aten._scaled_mm.default}
    saved = {aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
             aten._scaled_dot_product_cudnn_attention.default,
             aten._scaled_dot_product_flash_attention_for_cpu.default,
             c10d.reduce_scatter_tensor.default, aten.max.default}
    return matmuls, saved


def op_policy():
    """A fresh policy for one checkpointed forward of a block: odd matmuls (1st, 3rd, ...) and the ops of
    ``_op_sets`` saved, everything else recomputed.  The forward and the recomputation count their matmuls apart:
    torch 2.11 asks the policy again in the recomputation (``ctx.is_recompute``) and takes a saved output for each
    op it says to save, so one count running on from the forward's would, after a block's 7 matmuls, hand the k
    projection the q projection's output (seen on an H200); later torch replays the forward's choices instead."""
    from torch.utils.checkpoint import CheckpointPolicy

    matmuls, saved = _op_sets()
    counts = {False: 0, True: 0}  # matmuls seen, by ctx.is_recompute

    def policy(ctx, func, *args, **kwargs):
        if func in matmuls:
            counts[ctx.is_recompute] += 1
            keep = counts[ctx.is_recompute] % 2 == 1
        else:
            keep = func in saved
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _op_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(op_policy())


OFFLOAD_DESCRIPTION = ("each transformer block's saved tensors to pinned host memory in the forward, back in its "
                       "backward (torch offload_wrapper / save_on_cpu, on the compute stream)")


def apply_ac(model: nn.Module, layout) -> dict:
    """The layout's ``recompute`` (every ``recompute_every``-th block under full), then ``offload_activations``
    around each block (outermost, so that a checkpointed block's input is what travels)."""
    info = _apply_recompute(model, layout.recompute, layout.recompute_every)
    if layout.offload_activations:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import offload_wrapper

        for k, block in list(model.blocks.items()):
            model.blocks[k] = offload_wrapper(block)
        info["activation_offload"] = OFFLOAD_DESCRIPTION
    return info


def _apply_recompute(model: nn.Module, mode: str, every: int) -> dict:
    if mode == "none":
        return {}
    if mode in ("full", "op"):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        extra = {"context_fn": _op_context} if mode == "op" else {}
        for i, (k, block) in enumerate(list(model.blocks.items())):
            if i % every == 0:
                model.blocks[k] = checkpoint_wrapper(block, preserve_rng_state=False, **extra)
        if mode == "op":
            return {"recompute": OP_DESCRIPTION}
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

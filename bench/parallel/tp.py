"""Tensor parallelism with DTensor (Megatron-style 1-D TP over bench's own model, per block).

Column-wise: attention q/k/v (heads, and key/value heads under grouped-query attention, split over
ranks) and the MLP's input projections (gpt: ``fc_in``; llama: ``gate_proj``, ``up_proj``);
row-wise: attention ``o_proj`` and the MLP's output (gpt: ``fc_out``; llama: ``down_proj``).  Each
block then all-reduces twice in forward (after o_proj and after the MLP output) and twice in
backward (the gradients of the attention and MLP inputs), like Megatron.  Embeddings, norms and
the output head stay replicated.  Attention infers its local head counts from the projection
widths, so the model code is unchanged.

Two details keep the backward all-reduces at Megatron's count and width:
* the attention input becomes a DTensor once (PrepareModuleInput on ``attn``), so the gradients
  of q/k/v's shared input are summed locally and all-reduced once, not three times;
* under autocast the inputs of ``attn`` and ``mlp`` are cast to the autocast dtype first (the
  projections would cast them anyway), so the gradient is all-reduced in bf16, not in the norm's fp32.
"""
from __future__ import annotations

import torch
import torch.nn as nn

COLWISE = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.fc_in", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("attn.o_proj", "mlp.fc_out", "mlp.down_proj")


def apply_tp(model: nn.Module, tp_mesh) -> dict:
    """Shard every transformer block of ``model`` (bench's model or a pipeline stage of it) over tp_mesh."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   parallelize_module)

    names = None
    for block in model.blocks.values():
        present = {n for n, _ in block.named_modules()}
        plan = {"attn": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                           use_local_output=False)}
        plan.update({n: ColwiseParallel() for n in COLWISE if n in present})
        plan.update({n: RowwiseParallel() for n in ROWWISE if n in present})
        for sub in (block.attn, block.mlp):  # registered first: runs before the DTensor conversion
            sub.register_forward_pre_hook(_cast_to_autocast_dtype)
        parallelize_module(block, tp_mesh, plan)
        names = sorted(plan)
    cols = [n for n in (names or []) if n in COLWISE]
    rows = [n for n in (names or []) if n in ROWWISE]
    return {"tp_plan": f"ColwiseParallel: {', '.join(cols)}; RowwiseParallel: {', '.join(rows)}; attn input made "
                       "a DTensor once, attn/mlp inputs in the autocast dtype; embeddings, norms, head replicated"}


def _cast_to_autocast_dtype(module: nn.Module, args: tuple):
    x = args[0]
    kind = x.device.type
    if torch.is_autocast_enabled(kind) and x.is_floating_point():
        return (x.to(torch.get_autocast_dtype(kind)),) + args[1:]
    return None


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (a DTensor's local shard, or t itself)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def sharded_dims(t: torch.Tensor) -> tuple[str, ...]:
    """Names of the mesh dimensions a DTensor is split over (its pieces are disjoint there); () if whole."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(t, DTensor):
        return ()
    names = t.device_mesh.mesh_dim_names or tuple(str(i) for i in range(t.device_mesh.ndim))
    return tuple(n for n, pl in zip(names, t.placements) if isinstance(pl, Shard))

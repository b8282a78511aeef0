"""torch-native tensor parallelism (DTensor), used by the torch implementation of the
tp x pp x dp family (torch_pp.py; the registered strategies are in model_parallel.py).

torch-native TP (Megatron-style 1D TP over bench's own GPT, per block): q/k/v_proj and
mlp.fc_in are split column-wise (heads / hidden units over ranks), o_proj and mlp.fc_out
row-wise.  Like Megatron, each block then all-reduces twice in forward (after o_proj and after
fc_out) and twice in backward (the gradients of the attention and MLP inputs).  Embeddings,
LayerNorms and the output head stay replicated.  Attention infers its local head count from the
projection width, so the model code is unchanged.

Two details keep the backward all-reduces at Megatron's count and width (without them a block did
4 in backward, in fp32; on 1b, 2 x H200, eager, DTensor's redistributions were the largest host
cost of a host-bound step):
* the attention input becomes a DTensor once (PrepareModuleInput on ``attn``), so the
  gradients of q/k/v_proj's shared input are summed locally and all-reduced once, not three times;
* under autocast, the inputs of ``attn`` and ``mlp`` are cast to the autocast dtype first (the
  projections would cast them anyway), so the gradient is all-reduced in bf16, not in the
  LayerNorm's fp32.
"""
from __future__ import annotations

import torch
import torch.nn as nn


TP_PLAN_TEXT = ("ColwiseParallel: attn.q_proj/k_proj/v_proj, mlp.fc_in; RowwiseParallel: attn.o_proj, "
                "mlp.fc_out; attn input made a DTensor once, attn/mlp inputs in the autocast dtype; "
                "tok_emb, pos_emb, LayerNorms, head replicated")


def parallelize_blocks(model: nn.Module, tp_mesh) -> None:
    """Shard every transformer block of ``model`` (a GPT or a pipeline stage of it) over tp_mesh."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   parallelize_module)

    plan = {
        "attn": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                   use_local_output=False),
        "attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
        "attn.o_proj": RowwiseParallel(),
        "mlp.fc_in": ColwiseParallel(), "mlp.fc_out": RowwiseParallel(),
    }
    for block in model.blocks.values():
        for sub in (block.attn, block.mlp):  # registered first: runs before the DTensor conversion
            sub.register_forward_pre_hook(_cast_to_autocast_dtype)
        parallelize_module(block, tp_mesh, plan)


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


def is_sharded(t: torch.Tensor) -> bool:
    """True for a DTensor split over its mesh (its pieces are disjoint), False if replicated."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(t, DTensor) and any(isinstance(pl, Shard) for pl in t.placements)

"""torch-native tensor parallelism (DTensor), used by the torch implementation of the
tp x pp x dp family (torch_pp.py; the registered strategies are in model_parallel.py).

torch-native TP (Megatron-style 1D TP over bench's own GPT, per block): q/k/v_proj and
mlp.fc_in are split column-wise (heads / hidden units over ranks), o_proj and mlp.fc_out
row-wise, so each block needs one all-reduce in forward (after o_proj and after fc_out) and
one in backward.  Embeddings, LayerNorms and the output head stay replicated.  Attention
infers its local head count from the projection width, so the model code is unchanged.
"""
from __future__ import annotations

import torch
import torch.nn as nn


TP_PLAN_TEXT = ("ColwiseParallel: attn.q_proj/k_proj/v_proj, mlp.fc_in; RowwiseParallel: attn.o_proj, "
                "mlp.fc_out; tok_emb, pos_emb, LayerNorms, head replicated")


def parallelize_blocks(model: nn.Module, tp_mesh) -> None:
    """Shard every transformer block of ``model`` (a GPT or a pipeline stage of it) over tp_mesh."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {
        "attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
        "attn.o_proj": RowwiseParallel(),
        "mlp.fc_in": ColwiseParallel(), "mlp.fc_out": RowwiseParallel(),
    }
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, plan)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (a DTensor's local shard, or t itself)."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def is_sharded(t: torch.Tensor) -> bool:
    """True for a DTensor split over its mesh (its pieces are disjoint), False if replicated."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(t, DTensor) and any(isinstance(pl, Shard) for pl in t.placements)

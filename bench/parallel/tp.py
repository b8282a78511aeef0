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

precision=fp8 with tensorwise scaling (``float8=True``; the model was converted first,
bench/parallel/float8.py): torchao's float8 styles for the Float8Linear projections, and the attention's and
the MLP's inputs cast to float8 once for all their projections (PrepareFloat8ModuleInput), as torchtitan
does; a projection left in bf16 keeps the plain style.  The rowwise recipes keep the plain styles (torchao's
float8 styles assume one scale per tensor).
"""
from __future__ import annotations

import torch
import torch.nn as nn

COLWISE = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.fc_in", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("attn.o_proj", "mlp.fc_out", "mlp.down_proj")


def apply_tp(model: nn.Module, tp_mesh, float8: bool = False) -> dict:
    """Shard every transformer block of ``model`` (bench's model or a pipeline stage of it) over tp_mesh;
    ``float8``: torchao's float8 styles for its Float8Linear projections (module docstring)."""
    from torch.distributed.tensor.parallel import parallelize_module

    names = None
    for block in model.blocks.values():
        plan = _block_plan(block, float8)
        for sub in (block.attn, block.mlp):  # registered first: runs before the DTensor conversion
            sub.register_forward_pre_hook(_cast_to_autocast_dtype)
        parallelize_module(block, tp_mesh, plan)
        names = sorted(plan)
    cols = [n for n in (names or []) if n in COLWISE]
    rows = [n for n in (names or []) if n in ROWWISE]
    f8 = "; float8 (torchao's Float8Colwise/RowwiseParallel, inputs cast to float8 once)" if float8 else ""
    return {"tp_plan": f"ColwiseParallel: {', '.join(cols)}; RowwiseParallel: {', '.join(rows)}; attn input made "
                       "a DTensor once, attn/mlp inputs in the autocast dtype; embeddings, norms, head replicated" + f8}


def _block_plan(block: nn.Module, float8: bool) -> dict:
    """One block's parallelize_module plan: plain DTensor styles, or torchao's float8 ones where the
    projections are Float8Linear (an attention's / MLP's input is cast to float8 once only where every
    projection reading it is one)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    mods = dict(block.named_modules())
    f8 = {n for n, m in mods.items() if float8 and type(m).__name__ == "Float8Linear"}
    styles = {}
    if f8:
        from torchao.float8.float8_tensor_parallel import (Float8ColwiseParallel, Float8RowwiseParallel,
                                                           PrepareFloat8ModuleInput)
        styles = {"col": Float8ColwiseParallel, "row": Float8RowwiseParallel, "prep": PrepareFloat8ModuleInput}
    plan = {}
    for sub in ("attn", "mlp"):
        readers = {n for n in COLWISE if n in mods and n.startswith(sub + ".")}
        prep = styles["prep"] if f8 and readers <= f8 else (PrepareModuleInput if sub == "attn" else None)
        if prep is not None:
            plan[sub] = prep(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                             use_local_output=False)
    plan.update({n: (styles["col"] if n in f8 else ColwiseParallel)() for n in COLWISE if n in mods})
    plan.update({n: (styles["row"] if n in f8 else RowwiseParallel)() for n in ROWWISE if n in mods})
    return plan


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

"""Tensor parallelism, and the ``tp`` strategy.

``strategy=tp`` (and ``pp``, ``megatron``) is one family: the layout ``tp x pp x dp`` with
an implementation chosen by ``strategy.impl``: ``megatron`` (megatron-core, GPU only; see
bench/strategies/megatron) or ``torch`` (DTensor tensor parallelism from this module,
``torch.distributed.pipelining`` from torch_pp.py).  The registered classes only choose the
implementation; both implementations share the layout of bench/layout.py.

torch-native TP (Megatron-style 1D TP over bench's own GPT, per block): q/k/v_proj and
mlp.fc_in are split column-wise (heads / hidden units over ranks), o_proj and mlp.fc_out
row-wise, so each block needs one all-reduce in forward (after o_proj and after fc_out) and
one in backward.  Embeddings, LayerNorms and the output head stay replicated.  Attention
infers its local head count from the projection width, so the model code is unchanged.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from bench.strategies.base import StepResult, Strategy, register

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


# --------------------------------------------------------------------------- the registered family
class ModelParallel(Strategy):
    """The tp x pp x dp family: delegates to the implementation named by strategy.impl."""

    def __init__(self, plan, dist):
        super().__init__(plan, dist)
        if plan.strategy["impl"] == "megatron":
            from bench.strategies.megatron.strategy import MegatronModelParallel as impl
        else:
            from bench.strategies.torch_pp import TorchModelParallel as impl
        self.impl = impl(plan, dist)

    @classmethod
    def process_env(cls, plan) -> dict:
        """Environment this run's worker processes need before CUDA is initialised (for the
        worker to apply before torch.cuda.set_device): Megatron TP needs one CUDA connection."""
        if plan.strategy["impl"] == "megatron" and plan.tp > 1:
            return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        return {}

    def setup(self) -> None:
        self.impl.setup()

    def step(self, n: int) -> StepResult:
        return self.impl.step(n)

    def tokens_this_rank(self) -> int:
        return self.impl.tokens_this_rank()

    def describe(self) -> dict:
        return {"strategy": self.name, **self.impl.describe()}


@register("tp")
class TensorParallel(ModelParallel):
    """Tensor parallelism (strategy.tp > 1 by default); combines with pp and dp."""

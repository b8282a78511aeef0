"""AdamW over each rank's local shards of DTensor parameters (torch-native TP / PP, FSDP2).

AdamW is elementwise and every rank owns its shard, so stepping the local tensors is the same
update as stepping the DTensors, without DTensor's dispatch in every optimizer op (24 blocks at
micro dimensions on CPU, host time per step: foreach 54-71 -> 15-23 ms, fused 9-17 -> 5-10 ms;
results/2026-11-23-cpu-tp-host-cost.md).
"""
from __future__ import annotations

from typing import Iterable

import torch

from bench.strategies.torch_tp import local_tensor


class LocalShardAdamW:
    """torch AdamW holding each parameter's local tensor; ``point_grads`` before every step.

    Build it once the parameters' local tensors are final: FSDP2's lazy init (the first forward)
    may replace a shard's local tensor (``reset_sharded_param``), so FSDP builds this after its
    first backward."""

    def __init__(self, params: Iterable[torch.Tensor], optim: dict, fused: bool):
        self.params = list(params)
        self.local = [local_tensor(q.detach()) for q in self.params]
        self.optimizer = torch.optim.AdamW(self.local, lr=optim["lr"], betas=(optim["beta1"], optim["beta2"]),
                                           weight_decay=optim["weight_decay"], fused=fused)

    def zero_grad(self) -> None:
        """Drop both references to last step's gradients (the local one would keep its memory alive)."""
        for lp, q in zip(self.local, self.params):
            lp.grad = q.grad = None

    def point_grads(self) -> None:
        """Each local tensor's .grad is its parameter's gradient's local tensor (no copy)."""
        for lp, q in zip(self.local, self.params):
            lp.grad = local_tensor(q.grad) if q.grad is not None else None

    def step(self) -> None:
        self.point_grads()
        self.optimizer.step()

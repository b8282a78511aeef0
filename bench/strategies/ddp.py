"""PyTorch DistributedDataParallel: one replica per rank, gradients all-reduced in buckets
overlapped with backward; each rank takes its disjoint slice of the global batch."""
from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from bench.strategies.base import register
from bench.strategies.single import Single


@register("ddp")
class DDP(Single):
    @property
    def dp_rank(self) -> int:
        return self.dist.rank

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        s = self.plan.strategy
        ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(
            model, device_ids=ids, bucket_cap_mb=s["bucket_cap_mb"],
            gradient_as_bucket_view=s["gradient_as_bucket_view"], static_graph=s["static_graph"])
        if s["comm_hook"] != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            self.ddp.register_comm_hook(None, getattr(default_hooks, f"{s['comm_hook']}_hook"))
        return self.ddp

    def no_sync(self, last_micro_batch: bool):
        return contextlib.nullcontext() if last_micro_batch else self.ddp.no_sync()

    def describe(self) -> dict:
        s = self.plan.strategy
        return {**super().describe(), "dp": self.plan.dp_size, "bucket_cap_mb": s["bucket_cap_mb"],
                "gradient_as_bucket_view": s["gradient_as_bucket_view"], "static_graph": s["static_graph"],
                "comm_hook": s["comm_hook"], "token_rule": "sum over data-parallel ranks"}

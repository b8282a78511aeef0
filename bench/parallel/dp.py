"""The data-parallel reduction: FSDP2 (``fully_shard``) or torch DistributedDataParallel.

FSDP2: every ``blocks_per_unit`` consecutive blocks are one unit (one all-gather and one
reduce-scatter each: fewer, larger collectives and fewer hooks, whose host time bounds small
per-rank batches), then the root (embeddings, final norm, head).  ``reshard_after_forward`` frees
a unit's gathered parameters after its forward (ZeRO-3 analogue) or keeps them to backward (ZeRO-2
analogue).  precision=bf16|fp16 is FSDP's MixedPrecisionPolicy (sharded fp32 master parameters,
gathered and computed in the 16-bit dtype, gradients reduce-scattered in ``reduce_dtype``), not
autocast.  Over a tensor-parallel model it shards the DTensors over the dp mesh dimension (the
2-D FSDP x TP layout).  ``dp_replicate`` > 1 is HSDP: the dp dimension split into replicate x shard
(bench/parallel/mesh.py), a 2-D mesh on which fully_shard shards over the inner dimension and
all-reduces the gradient shards over the outer.

DDP: one replica per data-parallel rank, gradients all-reduced in buckets overlapped with backward
(torch's DDP does not take DTensor parameters: tensor parallelism with data parallelism is FSDP2's).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from bench.models.model import DTYPES
from bench.parallel.float8 import precompute_scales, precomputes_scales
from bench.parallel.mesh import data_mesh


def apply_fsdp(model: nn.Module, dp_mesh, precision: str, knobs: Any, offload: bool, device_type: str) -> dict:
    """fully_shard units of ``blocks_per_unit`` blocks, then the root; explicit prefetch of the next units
    (``knobs``: the FSDP strategy's schema: reduce_dtype, blocks_per_unit, reshard_after_forward, prefetch).

    The last unit's backward starts right after its forward, so it never reshards (that would only
    add an all-gather, as torchtitan notes), and neither does the root (embeddings, final norm,
    head): the head is the first thing backward needs (FSDP2's own heuristic for the root)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if precision == "fp32":
        mp = MixedPrecisionPolicy()
    else:
        dt = DTYPES[precision]
        mp = MixedPrecisionPolicy(param_dtype=dt, reduce_dtype=torch.float32 if knobs.reduce_dtype == "fp32" else dt)
    # CPU offload needs the parameters materialized on the host; pinned memory needs CUDA
    policy = CPUOffloadPolicy(pin_memory=device_type == "cuda") if offload else OffloadPolicy()
    k, reshard = knobs.blocks_per_unit, knobs.reshard_after_forward
    blocks = list(model.blocks.values())
    units = [blocks[i:i + k] for i in range(0, len(blocks), k)]
    for i, unit in enumerate(units):
        fully_shard(unit if len(unit) > 1 else unit[0], mesh=dp_mesh, mp_policy=mp, offload_policy=policy,
                    reshard_after_forward=reshard and i < len(units) - 1)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, offload_policy=policy, reshard_after_forward=False)
    n = knobs.prefetch
    if n > 0:  # issue the next n units' all-gathers from the CPU early (helps when CPU-bound)
        heads = [unit[0] for unit in units]  # a unit's FSDP state lives on its first block
        for i, head in enumerate(heads):
            head.set_modules_to_forward_prefetch(heads[i + 1:i + 1 + n])
            head.set_modules_to_backward_prefetch(heads[max(0, i - n):i][::-1])
    pdt = "bf16" if precision == "fp8" else precision  # fp8: the float8 matmuls are torchao's, the rest bf16
    rdt = "fp32" if knobs.reduce_dtype == "fp32" else pdt
    return {
        **_sharding_info(dp_mesh),
        "wrap": f"units of {k} transformer block(s), then the root" if k > 1 else "each transformer block, then the root",
        "blocks_per_unit": k,
        "reshard_after_forward": reshard,
        "reshard_note": "root and last unit never reshard after forward (backward needs them first)",
        "prefetch": n or "implicit (FSDP2 default)",
        "cpu_offload": offload,
        "precision": "fp32" if precision == "fp32" else
                     f"FSDP MixedPrecisionPolicy(param_dtype={pdt}, reduce_dtype={rdt}) over fp32 sharded "
                     "master weights (not autocast)" + (" + ShardedGradScaler" if precision == "fp16" else "")
                     + ("; torchao float8 matmuls in the converted Linear layers (see float8)" if precision == "fp8"
                        else ""),
    }


def _sharding_info(dp_mesh) -> dict:
    """What the states were sharded over: the dp ranks, or HSDP's shard dimension with its replicas."""
    over = "dp x cp" if "cp" in dp_mesh.mesh_dim_names[-1] else "dp"  # context parallelism: dp_cp, dp_shard_cp
    if dp_mesh.ndim == 1:
        return {"dp_reduction": "FSDP2 (torch.distributed.fsdp.fully_shard): parameters, gradients and optimizer "
                                f"states sharded over {over}"}
    rep, shard = dp_mesh.shape
    name = dp_mesh.mesh_dim_names[-1]
    return {"dp_reduction": f"HSDP: FSDP2 (torch.distributed.fsdp.fully_shard) over a 2-D mesh (dp_replicate "
                            f"{rep} x {name} {shard}): parameters, gradients and optimizer states sharded over "
                            f"{name} (all-gather / reduce-scatter), replicated over dp_replicate (the gradient "
                            "shards all-reduced)",
            "dp_replicate": rep, "dp_shard": shard}


REPLICA_KWARGS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "find_unused_parameters")


def apply_ddp(model: nn.Module, dp_group, device: torch.device, knobs: Any,
              find_unused_parameters: bool = False) -> tuple[nn.Module, dict]:
    """torch DistributedDataParallel over the dp process group (None: every rank); ``knobs``: the strategy's schema,
    whose DDP settings (REPLICA_KWARGS, comm_hook: those it has) are passed on, the others kept at torch's defaults;
    ``find_unused_parameters``: set it whatever the schema says (a pipeline, below)."""
    from torch.nn.parallel import DistributedDataParallel

    kw = {k: getattr(knobs, k) for k in REPLICA_KWARGS if hasattr(knobs, k)}
    if find_unused_parameters:
        kw["find_unused_parameters"] = True
    ddp = DistributedDataParallel(model, process_group=dp_group,
                                  device_ids=[device.index] if device.type == "cuda" else None, **kw)
    hook = getattr(knobs, "comm_hook", "none")
    if hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(dp_group, getattr(default_hooks, f"{hook}_hook"))
    return ddp, {"dp_reduction": "torch DistributedDataParallel: gradients all-reduced (averaged) over dp in buckets "
                                 "overlapped with backward",
                 "bucket_cap_mb": ddp.bucket_bytes_cap / 2**20, "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
                 "static_graph": ddp.static_graph, "find_unused_parameters": ddp.find_unused_parameters,
                 "comm_hook": hook}


# ------------------------------------------------------------------------------ data-parallel policies
class DataParallel:
    """No data parallelism (one replica, nothing wrapped): the base of the policies below.

    A policy owns what differs between the torch-native data-parallel reductions: whether it needs
    the device mesh, how it wraps the model chunks, how gradient sync is skipped on all but the last
    micro-batch, autocast vs its own mixed precision, the loss scaler, and whether the optimizer is
    built before the first step or after the first backward (``late_optimizer``)."""

    autocast = True  # forward under torch.autocast over fp32 weights
    shards = False  # parameters become this rank's shards (an optimizer over local tensors)
    late_optimizer = False

    def needs_mesh(self, plan) -> bool:
        return False

    def offload(self, plan) -> bool:
        """The model is built on the host (its states live there between uses)."""
        return False

    def wrap(self, chunks: list, plan, mesh, device: torch.device) -> tuple[list, dict]:
        return chunks, {}

    def no_sync(self, model: nn.Module, last: bool):
        return contextlib.nullcontext()

    def scaler(self, plan, device: torch.device):
        return None  # Precision makes torch's GradScaler for fp16

    def whole_model_note(self) -> str:
        return ""

    def after_step(self, chunks: list, plan) -> Optional[Callable[[], None]]:
        """What runs after each optimizer step, or None."""
        return None


class TorchDDP(DataParallel):
    """torch DistributedDataParallel over the dp ranks (dp = 1: nothing wrapped, single's step)."""


    def wrap(self, chunks: list, plan, mesh, device: torch.device) -> tuple[list, dict]:
        if plan.dp_size == 1:
            return chunks, {}
        # under a pipeline DDP sees one backward per micro-batch: its bucket rebuild after the first
        # iteration then records every parameter once per micro-batch and fails (reducer.cpp:
        # "rebuilt parameter indices size is not same"); find_unused_parameters=True never rebuilds
        group = mesh["dp"].get_group() if mesh is not None else None  # plain DDP: the default group
        out, info = [], {}
        for chunk in chunks:
            ddp, info = apply_ddp(chunk, group, device, plan.strategy, find_unused_parameters=plan.pp > 1)
            out.append(ddp)
        return out, info

    def no_sync(self, model: nn.Module, last: bool):
        return model.no_sync() if not last and hasattr(model, "no_sync") else contextlib.nullcontext()

    def whole_model_note(self) -> str:
        return " (after the DDP wrap)"


class FSDP2(DataParallel):
    """FSDP2 over the dp mesh dimension: its MixedPrecisionPolicy instead of autocast, its
    ShardedGradScaler for fp16, and the optimizer built after the first backward (FSDP2's lazy init may
    give a shard a new local tensor)."""

    autocast = False
    shards = True
    late_optimizer = True
    sync_every_microbatch = False  # strategy.sync_every_microbatch, set by wrap

    def needs_mesh(self, plan) -> bool:
        return True

    def offload(self, plan) -> bool:
        return bool(plan.strategy.cpu_offload)

    def wrap(self, chunks: list, plan, mesh, device: torch.device) -> tuple[list, dict]:
        # strategy.sync_every_microbatch: reduce-scatter after every micro-batch, not only the last
        self.sync_every_microbatch = bool(plan.strategy.sync_every_microbatch)
        dp_mesh = data_mesh(mesh, plan.layout)
        info: dict = {}
        lay = plan.layout
        if lay.dp_replicate > 1:  # the mesh as it ran (the layout's own is (pp, dp, cp, tp))
            info["device_mesh"] = {"shape": [lay.pp, lay.dp_replicate, lay.dp_shard, lay.cp, lay.tp],
                                   "dims": ["pp", "dp_replicate", "dp_shard", "cp", "tp"]}
        for chunk in chunks:
            info.update(apply_fsdp(chunk, dp_mesh, plan.run.precision, plan.strategy, self.offload(plan),
                                   device.type))
        return chunks, info

    def no_sync(self, model: nn.Module, last: bool):
        model.set_requires_gradient_sync(last or self.sync_every_microbatch)
        return contextlib.nullcontext()

    def scaler(self, plan, device: torch.device):
        if plan.run.precision != "fp16":
            return None
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device.type)

    def after_step(self, chunks: list, plan) -> Optional[Callable[[], None]]:
        """precision=fp8 with float8 all-gather: every float8 weight's scale for the next all-gather, computed
        in one all-reduce after the step (torchao's precompute_float8_dynamic_scale_for_fsdp), not one per
        weight at each gather."""
        return (lambda: precompute_scales(chunks)) if precomputes_scales(plan) else None

"""PyTorch FSDP2 (``fully_shard``) on a 1-D DeviceMesh over all ranks.

Every transformer block is its own FSDP unit (or every ``blocks_per_unit`` consecutive blocks:
fewer, larger collectives and fewer hooks, whose host time bounds small per-rank batches), then
the root (embeddings, final norm, head; it keeps its parameters gathered from forward to
backward, FSDP2's default for the root).
``reshard_after_forward`` true frees a block's gathered parameters after its forward and gathers
them again in backward (the ZeRO-3 analogue); false keeps them until backward (ZeRO-2 analogue).
precision=bf16|fp16 is FSDP's MixedPrecisionPolicy (sharded fp32 master parameters, gathered
and computed in the 16-bit dtype, gradients reduce-scattered in ``reduce_dtype``), not
autocast; fp16 adds a ShardedGradScaler (found-inf agreed over ranks).  Gradient accumulation
turns the reduce-scatter off (``set_requires_gradient_sync(False)``) for all but the last
micro-batch of a step.  AdamW steps each rank's local shards (LocalShardAdamW, the same update
without DTensor dispatch per optimizer op).
"""
from __future__ import annotations

import torch

from bench.data import SyntheticStream
from bench.memory_model import predicted_model_state_mb
from bench.model import build_model, lm_loss
from bench.strategies.base import StepResult, Strategy, compile_kwargs, register
from bench.strategies.local_adamw import LocalShardAdamW

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def shard_blocks(model, k: int, reshard_after_forward: bool, **kw) -> list[list]:
    """fully_shard every k consecutive blocks of bench's GPT as one unit, then the root; returns the units.

    The last unit's backward starts right after its forward, so it never reshards (that would only
    add an all-gather, as torchtitan notes), and neither does the root (embeddings, final norm,
    head): the head is the first thing backward needs (FSDP2's own heuristic for the root)."""
    from torch.distributed.fsdp import fully_shard

    blocks = list(model.blocks.values())
    units = [blocks[i:i + k] for i in range(0, len(blocks), k)]
    for i, unit in enumerate(units):
        fully_shard(unit if len(unit) > 1 else unit[0],
                    reshard_after_forward=reshard_after_forward and i < len(units) - 1, **kw)
    fully_shard(model, reshard_after_forward=False, **kw)
    return units


@register("fsdp")
class FSDP(Strategy):
    def setup(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

        p, dev = self.plan, self.dist.device
        cfg, s = p.cfg, p.strategy
        prec = cfg["precision"]
        self.mesh = init_device_mesh(dev.type, (self.dist.world_size,), mesh_dim_names=("dp",))
        if prec == "fp32":
            self.mp = MixedPrecisionPolicy()
        else:
            param_dtype = DTYPES[prec]
            self.mp = MixedPrecisionPolicy(
                param_dtype=param_dtype,
                reduce_dtype=torch.float32 if s["reduce_dtype"] == "fp32" else param_dtype)
        self.offload = s["cpu_offload"]
        # CPU offload needs the parameters materialized on the host; pinned memory needs CUDA
        offload = CPUOffloadPolicy(pin_memory=dev.type == "cuda") if self.offload else OffloadPolicy()
        self.model = build_model(p.model, cfg["seed"], "cpu" if self.offload else dev)
        if cfg["compile"]:
            for block in self.model.blocks.values():  # per block, before sharding: FSDP's hooks stay outside the graphs
                block.compile(**compile_kwargs(cfg))
        units = shard_blocks(self.model, s["blocks_per_unit"], reshard_after_forward=s["reshard_after_forward"],
                             mesh=self.mesh, mp_policy=self.mp, offload_policy=offload)
        n = s["prefetch"]
        if n > 0:  # issue the next n units' all-gathers from the CPU early (helps when CPU-bound)
            heads = [unit[0] for unit in units]  # a unit's FSDP state lives on its first block
            for i, head in enumerate(heads):
                head.set_modules_to_forward_prefetch(heads[i + 1:i + 1 + n])
                head.set_modules_to_backward_prefetch(heads[max(0, i - n):i][::-1])
        self.fused = dev.type == "cuda" and not self.offload
        # built after the first backward: FSDP2's lazy init (first forward) may give a shard a new
        # local tensor (reset_sharded_param), and the optimizer must hold the live ones
        self.optimizer = None
        self.scaler = None
        if prec == "fp16":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = ShardedGradScaler(device=dev.type)
        self.stream = SyntheticStream(p.model, seed=cfg["seed"], steps=cfg["steps"],
                                      dp_rank=self.dist.rank, dp_size=p.dp_size, device=dev)

    def step(self, n: int) -> StepResult:
        if self.optimizer is not None:
            self.optimizer.zero_grad()
        micro = self.stream.micro_batches(n, self.plan.micro_batch_size)
        total = torch.zeros((), device=self.dist.device)
        for i, (x, y) in enumerate(micro):
            self.model.set_requires_gradient_sync(i == len(micro) - 1)
            loss = lm_loss(self.model(x), y) / len(micro)
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
        if self.optimizer is None:
            self.optimizer = LocalShardAdamW(self.model.parameters(), self.plan.cfg["optim"], fused=self.fused)
        self.optimizer.point_grads()
        clip, opt = self.plan.cfg["optim"]["grad_clip"], self.optimizer.optimizer
        if self.scaler is None:
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            opt.step()
            return StepResult(loss=total)
        if clip > 0:
            self.scaler.unscale_(opt)  # the local gradients are the DTensor gradients' storage
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        before = self.scaler.get_scale()
        self.scaler.step(opt)
        self.scaler.update()
        return StepResult(loss=total, skipped=self.scaler.get_scale() < before)

    def describe(self) -> dict:
        p, s = self.plan, self.plan.strategy
        prec = p.cfg["precision"]
        rdt = "fp32" if s["reduce_dtype"] == "fp32" else prec
        return {
            "impl": "torch.distributed.fsdp.fully_shard (FSDP2)",
            "dp": p.dp_size,
            "mesh": f"1-D DeviceMesh ({p.device}, {p.world_size} ranks)",
            "wrap": (f"units of {s['blocks_per_unit']} transformer block(s), then the root"
                     if s["blocks_per_unit"] > 1 else "each transformer block, then the root"),
            "blocks_per_unit": s["blocks_per_unit"],
            "reshard_after_forward": s["reshard_after_forward"],
            "reshard_note": "root and last unit never reshard after forward (backward needs them first)",
            "prefetch": s["prefetch"] or "implicit (FSDP2 default)",
            "cpu_offload": s["cpu_offload"],
            "optimizer": f"torch.optim.AdamW(fused={getattr(self, 'fused', None)}) over each rank's local shards",
            "precision": "fp32" if prec == "fp32" else
                         f"FSDP MixedPrecisionPolicy(param_dtype={prec}, reduce_dtype={rdt}) over fp32 sharded "
                         f"master weights (not autocast)" + (" + ShardedGradScaler" if prec == "fp16" else ""),
            "compile": bool(p.cfg["compile"]),
            "micro_batch_size": p.micro_batch_size,
            "grad_accum": p.grad_accum,
            "init_device": "cpu" if s["cpu_offload"] else p.device,
            "predicted_memory_mb": predicted_model_state_mb(p),
        }

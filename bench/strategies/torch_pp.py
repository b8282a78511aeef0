"""Pipeline parallelism (the ``pp`` strategy) and the torch-native tp x pp x dp implementation.

torch-native (``strategy.impl=torch``), over bench's own GPT:

* PP: ``torch.distributed.pipelining``.  A stage is bench's GPT with the parts it does not
  own deleted (embeddings only on the first stage, final norm and head only on the last,
  an even share of the blocks), run by ``ScheduleGPipe``, ``Schedule1F1B`` or, with
  ``virtual_pipeline`` > 1 stages per rank (placement r, r + pp, ...),
  ``ScheduleInterleaved1F1B``.  The per-data-parallel-rank batch is split into
  ``microbatches`` micro-batches; the schedules average gradients over them.
* TP: DTensor Colwise/Rowwise on each block (bench/strategies/torch_tp.py).
* DP: gradients of every replica are averaged with flat all-reduces over the data-parallel
  process group after the backward passes of the step (like Megatron DDP without
  overlap_grad_reduce: no overlap with backward), so TP's DTensor shards and PP's stages need
  no wrapper.
* One DeviceMesh of shape (pp, dp, tp) in Megatron's rank order (bench/layout.py).

Initial weights are bench's (build_model with the run's seed) before splitting, so every
layout starts from the weights of strategy=single.
"""
from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from bench.data import SyntheticStream
from bench.layout import TOKEN_RULE, Layout, local_stages, resolve_schedule, stage_layers
from bench.model import GPT, build_model, lm_loss
from bench.strategies.base import Precision, StepResult, Strategy, compile_kwargs
from bench.strategies.local_adamw import LocalShardAdamW
from bench.strategies.torch_tp import TP_PLAN_TEXT, is_sharded, local_tensor, parallelize_blocks

DP_BUCKET_ELEMENTS = 25_000_000  # gradient elements per all-reduce (100 MB in fp32)


def stage_module(model: GPT, stage: int, n_stages: int) -> GPT:
    """Pipeline stage ``stage`` of ``n_stages``: the same GPT class holding only its own parts
    (shared with ``model``, not copied)."""
    if n_stages == 1:
        return model
    m = GPT.__new__(GPT)
    nn.Module.__init__(m)
    first, last = stage == 0, stage == n_stages - 1
    m.tok_emb = model.tok_emb if first else None
    m.pos_emb = model.pos_emb if first else None
    m.blocks = nn.ModuleDict({str(i): model.blocks[str(i)] for i in stage_layers(stage, len(model.blocks), n_stages)})
    m.norm = model.norm if last else None
    m.head = model.head if last else None
    return m


@torch.no_grad()
def clip_grads_(grads: list[torch.Tensor], max_norm: float, dev, tp_group=None, pp_group=None) -> None:
    """clip_grad_norm_ over the whole model: TP shards summed over tp, stages over pp."""
    sharded, replicated = torch.zeros((), device=dev), torch.zeros((), device=dev)
    for g in grads:
        sq = local_tensor(g).float().pow(2).sum()
        if is_sharded(g):
            sharded += sq
        else:
            replicated += sq
    if tp_group is not None:
        dist.all_reduce(sharded, group=tp_group)
    total = sharded + replicated
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    coef = (max_norm / (total.sqrt() + 1e-6)).clamp(max=1.0)
    for g in grads:
        local_tensor(g).mul_(coef)


def _buckets(tensors: list[torch.Tensor], cap: int):
    """Consecutive groups of same-dtype tensors of at most ``cap`` elements (at least one each)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        bucket, size = [], 0
        for t in group:
            if bucket and size + t.numel() > cap:
                yield bucket
                bucket, size = [], 0
            bucket.append(t)
            size += t.numel()
        if bucket:
            yield bucket


class TorchModelParallel(Strategy):
    """torch-native tp x pp x dp (not registered itself: strategies tp / pp with impl=torch)."""

    name = "torch"

    def setup(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        p, dev, cfg = self.plan, self.dist.device, self.plan.cfg
        s = p.strategy
        self.layout = Layout(tp=p.tp, pp=p.pp, dp=p.dp_size)
        self.coord = self.layout.coords(self.dist.rank)
        self.precision = Precision(cfg["precision"], dev)
        with self.setup_phase("device mesh"):
            self.mesh = init_device_mesh(dev.type, self.layout.mesh_shape, mesh_dim_names=("pp", "dp", "tp"))
        c = self.coord
        if list(self.mesh.get_coordinate()) != [c.pp, c.dp, c.tp]:
            raise RuntimeError(f"DeviceMesh coordinate {self.mesh.get_coordinate()} of rank {self.dist.rank} "
                               f"differs from bench.layout's {c}")

        self.virtual = s["virtual_pipeline"]
        self.n_stages = p.pp * self.virtual
        self.stage_ids = local_stages(c.pp, p.pp, self.virtual)
        with self.setup_phase("bench model"):
            full = build_model(p.model, cfg["seed"], dev)
            self.chunks = [stage_module(full, k, self.n_stages) for k in self.stage_ids]
            del full
        if p.tp > 1:
            with self.setup_phase("parallelize_module (TP)"):
                for chunk in self.chunks:
                    parallelize_blocks(chunk, self.mesh["tp"])
        if cfg["compile"]:  # per block, after TP (torchtitan's order): DTensor dispatch is traced away
            for chunk in self.chunks:
                for block in chunk.blocks.values():
                    block.compile(**compile_kwargs(cfg))
        self.params = [q for chunk in self.chunks for q in chunk.parameters()]

        self.schedule_name = resolve_schedule(s["schedule"], self.virtual) if p.pp > 1 else None
        self.schedule = None
        if p.pp > 1:
            with self.setup_phase("pipeline schedule"):
                self._build_schedule(dev, p.grad_accum)
        self.dp_group = self.mesh["dp"].get_group() if p.dp_size > 1 else None
        self.tp_group = self.mesh["tp"].get_group() if p.tp > 1 else None
        self.pp_group = self.mesh["pp"].get_group() if p.pp > 1 else None

        self.fused = dev.type == "cuda"
        with self.setup_phase("optimizer"):
            self.optimizer = LocalShardAdamW(self.params, cfg["optim"], fused=self.fused)
        self.stream = SyntheticStream(p.model, seed=cfg["seed"], steps=cfg["steps"], dp_rank=c.dp,
                                      dp_size=p.dp_size, device=dev)

    def _build_schedule(self, dev, m: int) -> None:
        """torch.distributed.pipelining stages of this rank's chunks, and the schedule over m micro-batches."""
        from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                  ScheduleInterleaved1F1B)

        group = self.mesh["pp"].get_group()
        stages = [PipelineStage(chunk, k, self.n_stages, dev, group=group)
                  for chunk, k in zip(self.chunks, self.stage_ids)]
        if self.schedule_name == "gpipe":
            self.schedule = ScheduleGPipe(stages[0], m, loss_fn=lm_loss)
        elif self.schedule_name == "1f1b":
            self.schedule = Schedule1F1B(stages[0], m, loss_fn=lm_loss)
        else:
            self.schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=lm_loss)
        # return_outputs=False (newer torch) keeps the last stage from concatenating the logits
        self._step_kwargs = ({"return_outputs": False}
                             if "return_outputs" in inspect.signature(self.schedule.step).parameters else {})

    # ------------------------------------------------------------------ step
    def step(self, n: int) -> StepResult:
        self.optimizer.zero_grad()
        if self.schedule is None:
            micro = self.stream.micro_batches(n, self.plan.micro_batch_size)
            loss = torch.zeros((), device=self.dist.device)
            for x, y in micro:
                with self.precision.autocast():
                    mb_loss = lm_loss(self.chunks[0](x), y) / len(micro)
                mb_loss.backward()
                loss += mb_loss.detach()
        else:
            x, y = self.stream[n]
            first, last = 0 in self.stage_ids, self.n_stages - 1 in self.stage_ids
            losses: list = []
            with self.precision.autocast():
                self.schedule.step(*((x,) if first else ()), target=y if last else None,
                                   losses=losses if last else None, **self._step_kwargs)
            loss = torch.stack([l.detach().float() for l in losses]).mean() if last else None
        self._average_dp_grads()
        if self.plan.cfg["optim"]["grad_clip"] > 0:
            self._clip_grads(self.plan.cfg["optim"]["grad_clip"])
        self.optimizer.step()
        return StepResult(loss=loss if self.layout.counts_tokens(self.coord) else None)

    @torch.no_grad()
    def _average_dp_grads(self) -> None:
        if self.dp_group is None:
            return
        grads = [local_tensor(q.grad) for q in self.params if q.grad is not None]
        for bucket in _buckets(grads, DP_BUCKET_ELEMENTS):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat, group=self.dp_group)
            flat.div_(self.plan.dp_size)
            for g, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                g.copy_(synced)

    def _clip_grads(self, max_norm: float) -> None:
        clip_grads_([q.grad for q in self.params if q.grad is not None], max_norm, self.dist.device,
                    self.tp_group, self.pp_group)

    # ------------------------------------------------------------------ accounting
    def tokens_this_rank(self) -> int:
        m = self.plan.model
        return self.layout.tokens_this_rank(self.dist.rank, m["global_batch"], m["seq_len"])

    def describe(self) -> dict:
        p, s = self.plan, self.plan.strategy
        layers = p.model["n_layers"] // self.n_stages
        return {
            "impl": "torch",
            "tp": p.tp, "pp": p.pp, "dp": p.dp_size,
            "rank_order": "rank = tp_rank + tp*dp_rank + tp*dp*pp_rank (Megatron's default order)",
            "device_mesh": {"shape": list(self.layout.mesh_shape), "dims": ["pp", "dp", "tp"]},
            "microbatches": p.grad_accum, "microbatches_setting": s["microbatches"],
            "micro_batch_size": p.micro_batch_size,
            "pipeline_schedule": type(self.schedule).__name__ if self.schedule is not None else None,
            "virtual_pipeline": self.virtual, "pipeline_stages": self.n_stages, "layers_per_stage": layers,
            "stages_of_rank0": local_stages(0, p.pp, self.virtual) if p.pp > 1 else None,
            "tp_plan": TP_PLAN_TEXT if p.tp > 1 else None,
            "sequence_parallel": False,
            "dp_grad_sync": (f"flat all-reduce (average) over dp after backward, buckets of "
                             f"{DP_BUCKET_ELEMENTS:,} elements, not overlapped") if p.dp_size > 1 else None,
            "optimizer": f"torch.optim.AdamW(fused={self.fused}) over each rank's local shards",
            "precision": {"fp32": "fp32", "bf16": "autocast bf16 over fp32 weights"}[p.cfg["precision"]],
            "grad_clip": "global norm over tp shards and pp stages" if p.cfg["optim"]["grad_clip"] > 0 else None,
            "compile": "each transformer block (torch.compile, after TP)" if p.cfg["compile"] else None,
            "token_rule": TOKEN_RULE,
        }

"""The torch-native strategies' one class: bench's model, the steps of bench/parallel applied in
torchtitan's order over one DeviceMesh built from the layout, and the training step.

The strategies differ in the data-parallel reduction they ask for (``data_parallel``): none
(single), torch DDP (ddp; tp / pp with impl=torch over dp > 1) or FSDP2 (fsdp), and in which
layout knobs their schema has.  Precision: autocast over fp32 weights (fp16: GradScaler), except
under FSDP2, whose MixedPrecisionPolicy casts the parameters (fp16: ShardedGradScaler).  Compile:
the whole (DDP-wrapped) model for plain single / DDP (one graph; DDP's optimizer splits it at its
buckets), per block otherwise.
"""
from __future__ import annotations

import contextlib
from typing import ClassVar, Optional

import torch

from bench.layout import TOKEN_RULE, Layout, resolve_schedule
from bench.model import build_model, lm_loss
from bench.parallel.ac import apply_ac
from bench.parallel.compile import apply_compile, compile_kwargs
from bench.parallel.dp import apply_ddp, apply_fsdp
from bench.parallel.mesh import build_mesh
from bench.parallel.optim import LocalShardAdamW, adamw, clip_grads_
from bench.parallel.pp import build_schedule, run_schedule, split_stages
from bench.parallel.tp import apply_tp
from bench.strategies.base import Precision, StepResult, Strategy

PRECISION_TEXT = {"fp32": "fp32", "bf16": "autocast bf16 over fp32 weights",
                  "fp16": "autocast fp16 over fp32 weights + GradScaler"}


class TorchParallel(Strategy):
    """bench's model under the torch-native steps its layout needs (module docstring)."""

    data_parallel: ClassVar[Optional[str]] = None  # None | "ddp" | "fsdp"

    def setup(self) -> None:
        p, dev, cfg, s = self.plan, self.dist.device, self.plan.cfg, self.plan.strategy
        self.layout = Layout(tp=p.tp, pp=p.pp, dp=p.dp_size)
        self.coord = self.layout.coords(self.dist.rank)
        self.fsdp = self.data_parallel == "fsdp"
        self.offload = bool(self.fsdp and s.get("cpu_offload"))
        self.info: dict = {}
        self.mesh = None
        if self.fsdp or p.tp > 1 or p.pp > 1:  # plain DDP reduces over the default group
            with self.setup_phase("device mesh"):
                self.mesh = build_mesh(self.layout, dev.type, self.dist.rank)
        with self.setup_phase("bench model"):
            model = build_model(p.model, cfg["seed"], "cpu" if self.offload else dev)
        if p.tp > 1:
            with self.setup_phase("parallelize_module (TP)"):
                self.info.update(apply_tp(model, self.mesh["tp"]))
        self.virtual = s.get("virtual_pipeline", 1)
        self.stage_ids, chunks = split_stages(model, self.coord.pp, p.pp, self.virtual)
        for chunk in chunks:
            self.info.update(apply_ac(chunk, cfg["recompute"]))
        self.whole_compile = cfg["compile"] and not (self.fsdp or p.tp > 1 or p.pp > 1)
        if cfg["compile"] and not self.whole_compile:  # per block, after TP (DTensor dispatch traced away)
            for chunk in chunks:
                self.info.update(apply_compile(chunk, cfg))
            if p.tp > 1:
                self.info["compile"] += ", after TP"
        with self.setup_phase("wrap"):
            wrapped = self._wrap(chunks, dev)
        self.params = [q for chunk in chunks for q in chunk.parameters()]  # after FSDP2 made them shards
        self.model = wrapped[0]
        if self.whole_compile:  # lazy: compiles in the first (warm-up) steps
            self.model = torch.compile(self.model, **compile_kwargs(cfg))
            self.info["compile"] = "the whole model" + (" (after the DDP wrap)" if self.data_parallel else "")
        self.precision = Precision(cfg["precision"], dev, autocast=not self.fsdp, scaler=self._sharded_scaler())
        self.schedule = None
        if p.pp > 1:
            with self.setup_phase("pipeline schedule"):
                self.schedule_name = resolve_schedule(s["schedule"], self.virtual)
                self.schedule, self._step_kwargs = build_schedule(
                    wrapped, self.stage_ids, p.pp * self.virtual, self.schedule_name, p.grad_accum, dev,
                    self.mesh["pp"].get_group())
        self.pp_group = self.mesh["pp"].get_group() if p.pp > 1 else None
        self.fused = dev.type == "cuda" and not self.offload
        self.optimizer = None
        self.local_shards = self.fsdp or p.tp > 1
        if not self.fsdp:  # FSDP2: after the first backward (its lazy init may give a shard a new local tensor)
            with self.setup_phase("optimizer"):
                self._build_optimizer()
        self.stream = self.data_stream(self.coord.dp)

    def _wrap(self, chunks: list, dev: torch.device) -> list:
        p, s = self.plan, self.plan.strategy
        if self.fsdp:
            for chunk in chunks:
                self.info.update(apply_fsdp(chunk, self.mesh["dp"], p.cfg["precision"], s, self.offload, dev.type))
            return chunks
        if self.data_parallel == "ddp" and p.dp_size > 1:
            out = []
            for chunk in chunks:
                # under a pipeline DDP sees one backward per micro-batch: its bucket rebuild after the first
                # iteration then records every parameter once per micro-batch and fails (reducer.cpp:
                # "rebuilt parameter indices size is not same"); find_unused_parameters=True never rebuilds
                knobs = dict(s, find_unused_parameters=True) if p.pp > 1 else s
                ddp, info = apply_ddp(chunk, self.mesh["dp"].get_group() if self.mesh else None, dev, knobs)
                out.append(ddp)
                self.info.update(info)
            return out
        return chunks

    def _sharded_scaler(self):
        if self.fsdp and self.plan.cfg["precision"] == "fp16":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            return ShardedGradScaler(device=self.dist.device.type)
        return None

    def _build_optimizer(self) -> None:
        o = self.plan.cfg["optim"]
        if self.local_shards:
            self.optimizer = LocalShardAdamW(self.params, o, fused=self.fused)
        else:
            self.optimizer = adamw(self.params, o, self.fused)

    # ------------------------------------------------------------------ step
    def _no_sync(self, last: bool):
        if self.fsdp:
            self.model.set_requires_gradient_sync(last)
        elif not last and hasattr(self.model, "no_sync"):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def step(self, n: int) -> StepResult:
        if self.optimizer is not None:
            self.optimizer.zero_grad() if self.local_shards else self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is None:
            micro = self.stream.micro_batches(n, self.plan.micro_batch_size)
            loss = torch.zeros((), device=self.dist.device)
            for i, (x, y) in enumerate(micro):
                with self._no_sync(i == len(micro) - 1):
                    with self.precision.autocast():
                        mb_loss = lm_loss(self.model(x), y) / len(micro)
                    self.precision.backward(mb_loss)
                loss += mb_loss.detach()
        else:
            x, y = self.stream[n]
            with self.precision.autocast():
                loss = run_schedule(self.schedule, self._step_kwargs, x, y, first=0 in self.stage_ids,
                                    last=self.plan.pp * self.virtual - 1 in self.stage_ids)
        if self.optimizer is None:
            self._build_optimizer()
        opt = self.optimizer
        if self.local_shards:
            opt.point_grads()
            opt = opt.optimizer
        clip = self.plan.cfg["optim"]["grad_clip"]
        skipped = self.precision.step(opt, self._clip if clip > 0 else None)
        return StepResult(loss=loss if self.layout.counts_tokens(self.coord) else None, skipped=skipped)

    def _clip(self) -> None:
        grads = [q.grad for q in self.params if q.grad is not None]
        if self.local_shards or self.pp_group is not None:
            clip_grads_(grads, self.plan.cfg["optim"]["grad_clip"], self.dist.device, self.pp_group)
        else:
            torch.nn.utils.clip_grad_norm_(self.params, self.plan.cfg["optim"]["grad_clip"])

    # ------------------------------------------------------------------ accounting
    def tokens_this_rank(self) -> int:
        m = self.plan.model
        return self.layout.tokens_this_rank(self.dist.rank, m["global_batch"], m["seq_len"])

    def describe(self) -> dict:
        p, s, cfg = self.plan, self.plan.strategy, self.plan.cfg
        out = {"impl": "torch", "tp": p.tp, "pp": p.pp, "dp": p.dp_size,
               "micro_batch_size": p.micro_batch_size, "grad_accum": p.grad_accum,
               "precision": PRECISION_TEXT[cfg["precision"]],
               "optimizer": f"torch.optim.AdamW(fused={self.fused})"
                            + (" over each rank's local shards" if self.local_shards else ""),
               "recompute": cfg["recompute"], "compile": None, "dp_reduction": None,
               "token_rule": TOKEN_RULE if p.tp > 1 or p.pp > 1 else "sum over data-parallel ranks"}
        if self.mesh is not None:
            out["rank_order"] = "rank = tp_rank + tp*dp_rank + tp*dp*pp_rank (Megatron's default order)"
            out["device_mesh"] = {"shape": list(self.layout.mesh_shape), "dims": ["pp", "dp", "tp"]}
        if p.tp > 1 or p.pp > 1 or "microbatches" in s:
            out.update(microbatches=p.grad_accum, microbatches_setting=s.get("microbatches"),
                       pipeline_schedule=type(self.schedule).__name__ if self.schedule is not None else None,
                       virtual_pipeline=self.virtual, pipeline_stages=p.pp * self.virtual,
                       layers_per_stage=p.model["n_layers"] // (p.pp * self.virtual), tp_plan=None,
                       sequence_parallel=False)
        out.update(self.info)
        if cfg["optim"]["grad_clip"] > 0:
            out["grad_clip"] = ("global norm over tp shards and pp stages" if self.local_shards or p.pp > 1
                                else "torch.nn.utils.clip_grad_norm_")
        return out

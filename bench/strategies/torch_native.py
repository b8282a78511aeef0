"""The torch-native strategies' one class: bench's model under ``parallelize`` (bench/parallel:
TP -> PP -> recompute -> compile -> the data-parallel policy, over one DeviceMesh built from the
layout) and the training step.

The strategies differ only in the data-parallel policy they hand it (bench/parallel/dp.py: none,
torch DDP, FSDP2: wrapping, gradient sync, autocast vs FSDP2's mixed precision, the loss scaler,
when the optimizer is built) and in which layout knobs their schema has.
"""
from __future__ import annotations

import contextlib

import torch

from bench.spec.layout import CP_TOKEN_RULE, DIMS, TOKEN_RULE
from bench.spec.layout_rules import microbatches_setting, splits_model
from bench.models.model import build_model, model_loss
from bench.parallel import cp as context_parallel
from bench.parallel.dp import DataParallel
from bench.parallel.mesh import build_mesh
from bench.parallel.optim import LocalShardAdamW, adamw, clip_grads_
from bench.parallel.parallelize import parallelize
from bench.parallel.pp import build_schedule, run_schedule
from bench.strategies.base import DistContext, Precision, StepResult, Strategy
from bench.spec.schema import Plan

PRECISION_TEXT = {"fp32": "fp32", "bf16": "autocast bf16 over fp32 weights",
                  "fp16": "autocast fp16 over fp32 weights + GradScaler",
                  "fp8": "torchao float8 matmuls in the converted Linear layers (layout's float8), autocast bf16 "
                         "elsewhere, over fp32 weights"}


def torch_native(policy: DataParallel):
    """What a torch-native strategy registers as its implementation: this class over its policy."""
    return lambda plan, dist: TorchParallel(plan, dist, policy)


class TorchParallel(Strategy):
    """bench's model under the torch-native steps its layout needs (module docstring)."""

    def __init__(self, plan: Plan, dist: DistContext, policy: DataParallel):
        super().__init__(plan, dist)
        self.policy = policy

    def setup(self) -> None:
        p, dev, run = self.plan, self.dist.device, self.plan.run
        self.layout = p.layout
        self.coord = self.layout.coords(self.dist.rank)
        self.offload = self.policy.offload(p)
        self.mesh = None
        # plain DDP reduces over the default group
        if self.policy.needs_mesh(p) or p.tp > 1 or p.pp > 1 or p.layout.cp > 1:
            with self.setup_phase("device mesh"):
                self.mesh = build_mesh(self.layout, dev.type, self.dist.rank)
        with self.setup_phase("bench model"):
            model = build_model(p.model, run.seed, "cpu" if self.offload else dev)
        self.virtual = p.layout.virtual_pipeline
        par = parallelize(model, p, self.mesh, self.policy, self.coord.pp, dev, self.setup_phase)
        self.info, self.stage_ids, self.model = par.info, par.stage_ids, par.model
        self.params = [q for chunk in par.chunks for q in chunk.parameters()]  # after FSDP2 made them shards
        self.after_step = self.policy.after_step(par.chunks, p)  # e.g. FSDP2's float8 scales (fp8)
        self.precision = Precision(run.precision, dev, autocast=self.policy.autocast,
                                   scaler=self.policy.scaler(p, dev))
        self.schedule = None
        if p.pp > 1:
            with self.setup_phase("pipeline schedule"):
                self.schedule_name = p.layout.schedule
                self.schedule, self._step_kwargs = build_schedule(
                    par.wrapped, self.stage_ids, p.pp * self.virtual, self.schedule_name, p.grad_accum, dev,
                    self.mesh["pp"].get_group())
        self.pp_group = self.mesh["pp"].get_group() if p.pp > 1 else None
        self.fused = dev.type == "cuda" and not self.offload
        self.optimizer = None
        self.local_shards = self.policy.shards or p.tp > 1
        if not self.policy.late_optimizer:
            with self.setup_phase("optimizer"):
                self._build_optimizer()
        with self.setup_phase("data stream"):
            self.stream = self.data_stream(self.coord.dp)

    def _build_optimizer(self) -> None:
        o = self.plan.run.optim
        if self.local_shards:
            self.optimizer = LocalShardAdamW(self.params, o, fused=self.fused)
        else:
            self.optimizer = adamw(self.params, o, self.fused)

    # ------------------------------------------------------------------ step
    def step(self, n: int) -> StepResult:
        if self.optimizer is not None:
            self.optimizer.zero_grad() if self.local_shards else self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is None:
            micro = self.stream.micro_batches(n, self.plan.micro_batch_size)
            loss = torch.zeros((), device=self.dist.device)
            for i, (x, y) in enumerate(micro):
                with self.policy.no_sync(self.model, i == len(micro) - 1), self.sequence_shard(x, y) as (x, y, pos):
                    with self.precision.autocast():
                        mb_loss = model_loss(self.model, x, y, pos, self.layout.loss_chunks) / len(micro)
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
        clip = self.plan.run.optim.grad_clip
        skipped = self.precision.step(opt, self._clip if clip > 0 else None)
        if self.after_step is not None:
            self.after_step()
        return StepResult(loss=loss if self.layout.counts_tokens(self.coord) else None, skipped=skipped)

    def sequence_shard(self, x: torch.Tensor, y: torch.Tensor):
        """This rank's shard of the sequences and their positions under context parallelism (bench/parallel/cp.py);
        without it the whole micro-batch (positions None: 0 .. s-1)."""
        if self.layout.cp == 1:
            return contextlib.nullcontext((x, y, None))
        return context_parallel.sequence_shard(self.mesh["cp"], x, y)

    def _clip(self) -> None:
        grads = [q.grad for q in self.params if q.grad is not None]
        if self.local_shards or self.pp_group is not None:
            clip_grads_(grads, self.plan.run.optim.grad_clip, self.dist.device, self.pp_group)
        else:
            torch.nn.utils.clip_grad_norm_(self.params, self.plan.run.optim.grad_clip)

    # ------------------------------------------------------------------ accounting
    def tokens_this_rank(self) -> int:
        m = self.plan.model
        return self.layout.tokens_this_rank(self.dist.rank, m.global_batch, m.seq_len)

    def describe(self) -> dict:
        p, s, run = self.plan, self.plan.strategy, self.plan.run
        out = {"impl": "torch", "tp": p.tp, "pp": p.pp, "dp": p.dp_size,
               "micro_batch_size": p.micro_batch_size, "grad_accum": p.grad_accum,
               "precision": PRECISION_TEXT[run.precision],
               "optimizer": f"torch.optim.AdamW(fused={self.fused})"
                            + (" over each rank's local shards" if self.local_shards else ""),
               "recompute": p.layout.recompute, "compile": None, "dp_reduction": None,
               "activation_offload": None,
               "token_rule": CP_TOKEN_RULE if self.layout.cp > 1 else
                             TOKEN_RULE if p.tp > 1 or p.pp > 1 else "sum over data-parallel ranks"}
        if self.mesh is not None:
            out["rank_order"] = "rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank)) (Megatron's default order)"
            out["device_mesh"] = {"shape": list(self.layout.mesh_shape), "dims": list(DIMS)}
        if self.layout.cp > 1:
            out.update(cp=self.layout.cp, **context_parallel.describe(self.layout.cp))
        if p.tp > 1 or p.pp > 1 or splits_model(s):
            out.update(microbatches=p.grad_accum, microbatches_setting=microbatches_setting(s),
                       pipeline_schedule=type(self.schedule).__name__ if self.schedule is not None else None,
                       virtual_pipeline=self.virtual, pipeline_stages=p.pp * self.virtual,
                       layers_per_stage=p.model.n_layers // (p.pp * self.virtual), tp_plan=None,
                       sequence_parallel=False)
        out.update(self.info)
        if run.optim.grad_clip > 0:
            out["grad_clip"] = ("global norm over tp shards and pp stages" if self.local_shards or p.pp > 1
                                else "torch.nn.utils.clip_grad_norm_")
        return out

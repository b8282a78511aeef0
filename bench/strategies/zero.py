"""DeepSpeed ZeRO stages 0-3 (optionally with optimizer / parameter offload) on bench's GPT.

The DeepSpeed config is generated from the Hydra config (``build_ds_config``, bench/strategies/zero_engine.py),
never read from a file, and recorded in ``describe()["ds_config"]``.  One ``step(n)`` is one optimizer step over
global batch n: this rank's slice is cut into ``plan.grad_accum`` micro-batches, each through ``engine(x)`` /
``engine.backward`` / ``engine.step``; DeepSpeed scales each micro-batch loss by 1/grad_accum and only reduces and
steps at the accumulation boundary (checked against ``engine.global_steps``).

Precision is DeepSpeed's own by default: bf16/fp16 mean 16-bit parameters, gradients and compute with fp32 master
weights and Adam states inside DeepSpeed's optimizer wrapper; fp16 adds DeepSpeed's dynamic loss scaling, and a step
skipped for overflow comes back as ``StepResult(skipped=True)`` (``engine.was_step_applied()``).  With
``strategy.autocast=true`` it is DeepSpeed's ``torch_autocast`` instead: fp32 weights, forward under torch.autocast as
in ``single``; fp16 then scales with torch's GradScaler, whose lowered scale marks a skipped step (DeepSpeed does not
report those in ``was_step_applied``).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from bench.metrics.flops import param_groups
from bench.spec.schema import (BenchConfig, ConfigError, Plan, StrategyConfig, Section, alias_default, check_positive,
                              check_whole, knob)
from bench.strategies.registry import (AUTOCAST_COPY, FP32, MIXED, ModelStates, StrategySpec, knob_text,
                                      register)
from bench.strategies.zero_rules import (REDUCE_DTYPES, check_adam, half_reduced_share, rules_deepcompile, rules_no_grad_norm,
                                        rules_reduce_dtype, runs_torch_autocast)
from bench.costs.traffic import all_gather, all_reduce, buckets, param_tensors
from bench.parallel.compile import refuse_graphs_across_microbatches


# --------------------------------------------------------------------------- schema
@dataclass
class ZeroFP16Config(Section):
    """DeepSpeed fp16 dynamic loss scaling (DeepSpeed's defaults; used only when precision=fp16)."""

    loss_scale: float = knob(0.0, "0 = dynamic loss scaling; > 0 = that static scale")
    initial_scale_power: int = knob(16, "the first scale is 2**initial_scale_power")
    loss_scale_window: int = knob(1000, "steps without overflow before the scale doubles")
    hysteresis: int = knob(2, "overflows tolerated before the scale is lowered")
    consecutive_hysteresis: bool = knob(False, "refill hysteresis on every non-overflow step")
    min_loss_scale: float = 1.0


OFFLOAD = ("none", "cpu")
# the stages whose DeepSpeed code reads each knob (stage 0: engine.allreduce_gradients, a fixed 5e8-element buffer, no
# overlap; 1-2: stage_1_and_2.py; 3: stage3.py; leaf_blocks: bench's ZeRO-3 leaf modules); elsewhere only the default
STAGE_KNOBS = {"reduce_bucket_size": (1, 2, 3), "allgather_bucket_size": (1, 2), "overlap_comm": (1, 2, 3),
               "contiguous_gradients": (1, 2, 3), "prefetch_bucket_size": (3,), "param_persistence_threshold": (3,),
               "max_live_parameters": (3,), "leaf_blocks": (3,)}
STAGE_KNOB_INERT = {"overlap_comm": (False,)}  # says what runs where the knob is not read
STAGE0_ALLREDUCE_ELEMENTS = 5e8  # stage 0's gradient all-reduce buffer (engine.py MEMORY_OPT_ALLREDUCE_SIZE), fixed
ADAM = ("auto", "torch", "deepspeed")


@dataclass
class ZeroConfig(StrategyConfig):
    """DeepSpeed ZeRO through deepspeed.initialize (defaults are DeepSpeed 0.19's; sizes count elements)."""

    name: str = "zero"
    impl: str = "deepspeed"
    zero_stage: int = knob(alias_default("zero_stage", 0), "0: plain data parallel; 1: optimizer states sharded; "
                           "2: + gradients (reduce-scatter); 3: + parameters (gathered per layer in forward and again "
                           "in backward)", choices=(0, 1, 2, 3))
    autocast: bool = knob(False, "false: DeepSpeed's own 16-bit training (16-bit params, fp32 master in its optimizer "
                          "wrapper: host work per step); true: DeepSpeed's torch_autocast (fp32 weights, forward "
                          "under torch.autocast, as single)", tune=(False, True), added=True)
    offload_optimizer: str = knob("none", "cpu: optimizer states and step on the host (DeepSpeedCPUAdam): frees "
                                  "12 B/param of GPU memory for PCIe traffic and a CPU Adam step; stages 1-3",
                                  choices=OFFLOAD, fallback=OFFLOAD)
    offload_param: str = knob("none", "cpu: stage 3's parameter shards on the host, copied in before each gather",
                              choices=OFFLOAD, fallback=OFFLOAD)
    adam: str = knob("auto", "the Adam step without optimizer offload: torch = torch.optim.AdamW, fused on CUDA (the "
                     "torch-native strategies' optimizer; nothing to JIT-build); deepspeed = DeepSpeed's FusedAdam "
                     "(CUDA; JIT-built on a host's first DeepSpeed run); auto = torch, but deepspeed for DeepSpeed's "
                     "own fp16 at stage 0 on CUDA (its fused FP16_Optimizer takes FusedAdam only): on one H200 both "
                     "ran Llama 3.2 1B ZeRO-1/2 at the same speed and losses, torch without the 37 s build "
                     "(results/2026-12-06-h200x1-adam-and-host)",
                     choices=ADAM, added=True)
    reduce_bucket_size: float = knob(5e8, "gradient bucket of the reduce (elements): bigger = fewer, later "
                                     "collectives; smaller = finer overlap with backward", tune=(5e8, 5e7))
    allgather_bucket_size: float = knob(5e8, "stages 1-2: bucket of the parameter all-gather after the step")
    overlap_comm: Optional[bool] = knob(None, "stages 1-3: overlap gradient reduction with backward; null = "
                                        "DeepSpeed's default (true for stage 3, false for 1-2)", tune=(None, True))
    contiguous_gradients: bool = knob(True, "copy gradients into one contiguous buffer as produced")
    reduce_dtype: str = knob("auto", "the dtype gradients are summed in across ranks: auto (DeepSpeed's: the 16-bit "
                             "one under its own bf16 / fp16; with autocast=true fp32 at stage 0, and at stages 1-3 the "
                             "blocks' Linear gradients in 16 bit, the rest in fp32) | fp32 | param (the 16-bit one)",
                             choices=REDUCE_DTYPES, added=True)
    compute_grad_norm: bool = knob(True, "stages 1-2: false skips DeepSpeed's per-step global gradient norm and its "
                                   "host check (needs no clipping and no optimizer offload)", tune=(True, False),
                                   added=True)
    prefetch_bucket_size: float = knob(5e7, "stage 3: parameter elements gathered ahead of use")
    param_persistence_threshold: float = knob(1e5, "stage 3: parameters smaller than this stay whole on every rank")
    max_live_parameters: float = knob(1e9, "stage 3: gathered parameter elements alive at once")
    leaf_blocks: bool = knob(False, "stage 3: each block one ZeRO-3 leaf module (one gather and one gradient hook "
                             "per block instead of per parameter)", tune=(False, True), added=True)
    deepcompile: bool = knob(False, "stages 1-3, compile=true, CUDA: DeepSpeed's DeepCompile backend puts the "
                             "gathers / reductions into the compiled graph", added=True)
    fp16: ZeroFP16Config = field(default_factory=ZeroFP16Config)
    ds_config: dict[str, Any] = knob(None, "raw DeepSpeed config deep-merged last (new keys need +: "
                                     "+strategy.ds_config.zero_optimization.round_robin_gradients=true)", factory=dict)


# keys of the DeepSpeed config that bench derives itself (batch layout): ds_config may not set them
DERIVED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def rules(plan: Plan) -> None:
    s, c = plan.strategy, plan.run
    stage = s.zero_stage
    if stage < 2:  # stages 0-1 keep gradients in param.grad across micro-batches; 2-3 move them out each one
        refuse_graphs_across_microbatches(plan)
    if s.offload_optimizer != "none" and stage == 0:
        raise ConfigError("strategy.offload_optimizer", s.offload_optimizer,
                          "optimizer offload needs ZeRO stage 1, 2 or 3 (strategy.zero_stage=0 here); "
                          "use offload_optimizer=none or zero_stage>=1")
    if s.offload_param != "none" and stage != 3:
        raise ConfigError("strategy.offload_param", s.offload_param,
                          f"parameter offload needs ZeRO stage 3 (strategy.zero_stage={stage} here); "
                          "use offload_param=none or zero_stage=3")
    for key, stages in STAGE_KNOBS.items():  # a knob its stage does not read: the record would say it ran
        value, default = getattr(s, key), ZeroConfig.__dataclass_fields__[key].default
        if stage not in stages and value not in (default, *STAGE_KNOB_INERT.get(key, ())):
            raise ConfigError(f"strategy.{key}", value, f"is read at ZeRO stage{'s' * (len(stages) > 1)} "
                              f"{', '.join(map(str, stages))} only (strategy.zero_stage={stage} here); leave it at "
                              f"{'null' if default is None else knob_text(default)} or change zero_stage")
    check_adam(plan)
    for key in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size", "max_live_parameters"):
        check_whole(f"strategy.{key}", getattr(s, key))
    check_whole("strategy.param_persistence_threshold", s.param_persistence_threshold, allow_zero=True)
    rules_reduce_dtype(plan)
    if not s.compute_grad_norm:
        rules_no_grad_norm(plan)
    if s.deepcompile:
        rules_deepcompile(plan)
    if stage == 3 and c.compile and plan.device == "cuda" and not s.deepcompile:
        raise ConfigError("compile", True, "with strategy.zero_stage=3 on CUDA, DeepSpeed 0.19.8's engine.compile "
                          "trains a different model (its losses leave single's from the second step); use "
                          "compile=false, zero_stage 0-2, or strategy.deepcompile=true (DeepSpeed's own compiler "
                          "for ZeRO-3, which keeps the losses)")
    f = s.fp16
    if s.autocast and c.precision == "fp32":
        raise ConfigError("strategy.autocast", True, "autocast runs the forward in bf16 or fp16; set precision=bf16 "
                          "or precision=fp16, or strategy.autocast=false for fp32")
    if s.autocast and c.precision == "fp16":
        changed = [k for k, v in dataclasses.asdict(ZeroFP16Config()).items() if getattr(f, k) != v]
        if changed:
            raise ConfigError(f"strategy.fp16.{changed[0]}", getattr(f, changed[0]),
                              "applies to DeepSpeed's own fp16 only; with strategy.autocast=true the loss scaling "
                              "is torch's GradScaler at its defaults (leave strategy.fp16 unset or set autocast=false)")
    if f.loss_scale < 0:
        raise ConfigError("strategy.fp16.loss_scale", f.loss_scale, "must be >= 0 (0 = dynamic loss scaling)")
    if not 0 <= f.initial_scale_power <= 64:
        raise ConfigError("strategy.fp16.initial_scale_power", f.initial_scale_power, "must be in 0..64")
    check_positive("strategy.fp16.loss_scale_window", f.loss_scale_window)
    check_positive("strategy.fp16.hysteresis", f.hysteresis)
    if f.min_loss_scale <= 0:
        raise ConfigError("strategy.fp16.min_loss_scale", f.min_loss_scale, "must be > 0")
    for key in DERIVED_KEYS:
        if key in (s.ds_config or {}):
            raise ConfigError(f"strategy.ds_config.{key}", s.ds_config[key],
                              "is derived from model.global_batch and strategy.micro_batch_size; set those instead")


def model_states(run: BenchConfig) -> ModelStates:
    """DeepSpeed's 16-bit wrapper: 2 + 2 + 12 B/param; fp32 / torch_autocast: 4 + 4 + 8, with one more fp32 copy
    of the partition at stages 1-2 (and with optimizer offload); offload moves parts to the host."""
    s, prec = run.strategy, run.precision
    autocast = runs_torch_autocast(run)
    scheme = FP32 if prec == "fp32" else MIXED
    if autocast:
        scheme = AUTOCAST_COPY if s.zero_stage in (1, 2) or s.offload_optimizer != "none" else FP32
    off = s.offload_optimizer != "none"
    return ModelStates(scheme, stage=s.zero_stage, offload_optimizer=off, host_fp32_grad_partition=off,
                       # ZeRO-3 keeps its gradient partition on the optimizer's device (stage3.py grad_partitions_flat_buffer)
                       offload_grads=off and s.zero_stage == 3,
                       offload_param=s.offload_param != "none", sixteen_bit_weights=not autocast,
                       # ZeRO-3 allocates its flat gradient partition at initialize; stages 0-2 fill gradients
                       # (stage 2 its partition) from the backward on
                       grads_live=s.zero_stage == 3,
                       # NVML used - reserved of one-GPU ZeRO runs in results/ is 0.39 GiB above torch's: DeepSpeed's
                       # own communicator, made at world_size 1 too (bench/plan/memory_margins.py NCCL_COMM_BYTES)
                       extra_communicators=1,
                       # engine.compile: one graph for the model, whose gradients (and so the hooks that fill the
                       # reduce buckets) come out when its whole backward has run
                       late_grad_hooks=bool(run.compile) and not s.deepcompile,
                       note=f"DeepSpeed ZeRO-{s.zero_stage}" + (" torch_autocast" if autocast else ""))


def _reduce_buckets(plan: Plan) -> tuple[float, float]:
    """(bytes held from initialize, bytes held in backward) of the reduce buckets, reduce_bucket_size elements
    each.  Stages 1-2 (stage_1_and_2.py setup_buckets, at a backward's first gradient hook, released at its end):
    one per communication dtype (under torch_autocast by default Linear gradients are reduced in 16 bit, the rest
    in fp32: two), in the parameters' dtype, twice with overlap_comm.  Stage 3 (stage3.py, at initialize): one per
    communication dtype, in that dtype.  DeepCompile drops those (init_z3) for its own, per gradient dtype and
    double-buffered, allocated at the first gradient and released at the end of backward (deepcompile.h
    DoubleBufferedReduceBucket).  Without contiguous_gradients: none (gradients stay in param.grad)."""
    s, comm = plan.strategy, _comm_dtypes(plan)
    n = float(s.reduce_bucket_size) if s.contiguous_gradients else 0.0
    if s.deepcompile:
        return 0.0, 2 * n * _param_bytes(plan)
    if s.zero_stage == 3:
        return n * sum(nbytes for nbytes, _ in comm), 0.0
    return 0.0, len(comm) * (2 if s.overlap_comm else 1) * n * _param_bytes(plan)


def _comm_dtypes(plan: Plan) -> tuple[tuple[int, float], ...]:
    """(bytes an element, share of the gradient elements) of each dtype the run's gradients are reduced in: 16 bit
    (``half_reduced_share``), fp32 the rest; one reduce bucket per dtype."""
    half = half_reduced_share(plan)
    return tuple((nbytes, share) for nbytes, share in ((2, half), (4, 1 - half)) if share > 0)


def phase_buffers(plan: Plan, psi: float, per_block: float) -> tuple[dict[str, float], str]:
    """Stages 1-2: the reduce buckets, allocated whole at a backward's first gradient hook and freed by the epilogue
    (setup_buckets, _release_ipg_buffers); stage 1 runs it at the boundary only, so with accumulation the buckets stay
    beside the later micro-batches' activations ("pass": 3,815 MiB at Llama 3.2 1B's peak,
    results/2026-12-06-h100x1-zero-memory).  ZeRO-3: its gathered parameters, from forward to backward.  The step:
    the gradient partition flattened (16-bit, or fp32 under torch_autocast) and cast to fp32 for the optimizer
    (stage_1_and_2.py step; stage3.py _prepare_fp32_grad_for_sub_group, one sub-group of at most sub_group_size
    parameters at a time); with optimizer offload the host holds those.  DeepCompile: its own, in backward."""
    s, stage = plan.strategy, plan.strategy.zero_stage
    out = {}
    if stage:
        kept = stage == 1 and plan.grad_accum > 1 and not s.deepcompile
        out["pass" if kept else "backward"] = _reduce_buckets(plan)[1]
    if stage == 3:
        out["pass"] = _gathered_params(plan, psi, per_block) * _param_bytes(plan)
    if stage and s.offload_optimizer == "none":
        n = psi if stage < 3 else min(psi, float(_zero_option(plan, "sub_group_size", 1e9)))
        out["step"] = n / plan.dp_size * (4 if _param_bytes(plan) == 4 else 2 + 4)
    return out, ("ZeRO reduce buckets in backward (reduce_bucket_size elements per communication dtype, x2 with "
                 "overlap_comm)" if stage in (1, 2) else "ZeRO-3 gathered parameters from forward to backward"
                 ) + "; the step's flattened gradient partition and its fp32 copy"


def _param_bytes(plan: Plan) -> int:
    """Bytes of a parameter as DeepSpeed holds it in the model: fp32 under torch_autocast or in fp32 runs."""
    return 4 if plan.run.precision == "fp32" or runs_torch_autocast(plan.run) else 2


def _zero_option(plan: Plan, key: str, default: float) -> float:
    """A zero_optimization setting bench leaves at DeepSpeed's default unless ds_config sets it."""
    return ((plan.strategy.ds_config or {}).get("zero_optimization") or {}).get(key, default)


def _kept_params(plan: Plan, per_block: float) -> float:
    """Elements of ZeRO-3's parameters that stay gathered from their forward to their backward: from step 2 (the
    trace complete) a parameter used again within stage3_max_reuse_distance elements (1e9) of the trace is not
    released (partitioned_param_coordinator.py __params_to_release).  Counted over the rest of the forward (the
    blocks after it and the head): the runs held every block of 300m, 500m and 1b (36 blocks of 28M) at dp 2-4
    (results/2026-11-23-h200x2-ddp-ceiling-graph-exit), where the trace's forward and backward together would have
    released 1b's first half."""
    g, L = param_groups(plan.model), plan.model.n_layers
    reuse = float(_zero_option(plan, "stage3_max_reuse_distance", 1e9))
    head = g["head"] + g["norm"]
    blocks = min(L, max(0, math.ceil((reuse - head) / per_block)))
    return blocks * per_block + head + (g["embedding"] if L * per_block + head < reuse else 0)


def _gathered_params(plan: Plan, psi: float, per_block: float) -> float:
    """Elements of ZeRO-3's gathered parameters when backward starts.  One rank without parameter offload: none
    (a gathered parameter is its own partition, no copy).  Otherwise the prefetch bucket and the block in use, or
    more: those kept from forward to backward (:func:`_kept_params`)."""
    s = plan.strategy
    if plan.dp_size == 1 and s.offload_param == "none" and not s.deepcompile:  # DeepCompile copies
        return 0.0
    return min(psi, max(_kept_params(plan, per_block), float(s.prefetch_bucket_size) + per_block))


def buffers(plan: Plan, psi: float, per_block: float) -> tuple[float, str]:
    """ZeRO-3's reduce buckets, allocated at initialize."""
    if plan.strategy.zero_stage != 3:
        return 0.0, ""
    return _reduce_buckets(plan)[0], "ZeRO-3 reduce buckets (reduce_bucket_size elements per communication dtype)"


# ZeRO-3's host operations (bench/costs/traffic.py "hooks") per micro-batch: each hooked module's fetch and release in
# forward and backward (pre / post hooks, the gather's launch, status bookkeeping), each parameter's gather,
# partition and release (one H200, gpt2: 12 leaf blocks ran in 100-150 ms a step, 132 hooked modules in 183-252,
# against 28 ms for single; results/2026-11-25-h100-search-1gpu, results/2026-11-25-h200-search-1gpu)
FETCH_OPS, PARAM_OPS = 12, 8
CAST_BYTES = (4 + 2) + (2 + 4)  # a gradient element cast to its communication dtype and back, fp32 <-> 16 bit


def traffic(plan: Plan, params: float) -> dict[str, float]:
    """Stage 0: one all-reduce of the gradients after backward; 1-2: gradients reduced in buckets (overlapped only with
    overlap_comm), at stage 2 every micro-batch from the per-parameter backward hooks (each gradient then copied into
    its partition), at stage 1 once, at the accumulation boundary (stage_1_and_2.py
    reduce_ready_partitions_and_remove_grads), the updated parameters all-gathered after the step, and with overlap_comm
    the host waits for the device at the end of each reducing backward (a sync); 3: every micro-batch gathers each
    module's parameters for forward and again for backward and reduce-scatters the gradients, the host waiting for them
    at the backward's end.  Parameters travel in their dtype (fp32 under autocast), gradients in 16 bit or fp32 by
    strategy.reduce_dtype (``half_reduced_share``: under autocast at stages 1-3 the Linear ones in 16 bit).  Host: those
    Python hooks (per module at stage 3, per block with leaf_blocks), the step's pass over the parameters (twice with
    DeepSpeed's 16-bit wrapper, whose module hooks also leave a compiled step eager), a host read of the gradient norm;
    offload crosses PCIe and runs Adam on the host."""
    s, dp, m, n = plan.strategy, plan.dp_size, plan.grad_accum, param_tensors(plan)
    autocast = runs_torch_autocast(plan.run)
    stage, elem = s.zero_stage, 4 if plan.run.precision == "fp32" or autocast else 2
    overlap = stage == 3 if s.overlap_comm is None else s.overlap_comm
    comm, grads = _comm_dtypes(plan), params * elem
    reduce_elem = sum(nbytes * share for nbytes, share in comm)  # bytes a gradient element is reduced in, on average
    red, half = params * reduce_elem, dict(comm).get(2, 0.0)
    wrapper = not autocast and plan.run.precision != "fp32"  # DeepSpeed's own 16-bit optimizer wrapper
    norm = s.compute_grad_norm and (stage > 0 or wrapper)  # stage 0 under autocast: torch's AdamW, no norm
    out = {"hooks": n * (3 if wrapper else 1), "syncs": int(norm), "eager": int(wrapper),
           "grad_elem": reduce_elem * (dp > 1)}
    # gradients reduced in another dtype than their own: cast into it and the sum copied back, each a read and a write
    # (stage_1_and_2.py gradient_reduction_w_predivide, stage3.py __avg_scatter_grads), once a reduction
    cast = CAST_BYTES * params * (dp > 1) * (half if elem == 4 else 1 - half) * (m if stage in (2, 3) else 1)
    if stage == 0:
        out.update(tail=all_reduce(red, dp), collectives=buckets(grads, STAGE0_ALLREDUCE_ELEMENTS * elem))
    elif stage in (1, 2):
        # each reduce bucket all-reduced whole, every rank keeping its partition (use_multi_rank_bucket_allreduce,
        # DeepSpeed's default); without it one reduce per partition to its owner: the bucket's bytes, in n calls
        multi = _zero_option(plan, "use_multi_rank_bucket_allreduce", True)
        per_mb = m if stage == 2 else 1  # stage 2 reduces every micro-batch from its hooks; stage 1 at the boundary
        reduce = per_mb * (all_reduce(red, dp) if multi else red * (dp > 1))
        out["grad_reduce" if overlap else "tail"] = reduce
        nb = _reduce_buckets_count(plan, params, comm)
        out.update(tail=out.get("tail", 0.0) + all_gather(grads, dp), hooks=out["hooks"] + stage * n * m,
                   collectives=(per_mb * (1 if multi else dp) + 1) * nb)
        # the hooks launch a reduction only when a bucket fills: the ranks meet once a bucket, not once a layer
        out["lockstep"] = min(1.0, out["collectives"] / (plan.model.n_layers / plan.pp * m))
        if overlap and not s.deepcompile:  # the host waits on the device before the buckets are freed: after each
            # reducing backward (independent_gradient_partition_epilogue; DeepCompile reduces in its graph and skips
            # it) and, without the multi-rank all-reduce, before each reduce
            out["syncs"] += per_mb * (1 + (0 if multi else dp * nb))  # (allreduce_and_copy)
    else:
        per_block = s.leaf_blocks or s.deepcompile
        modules = plan.model.n_layers * (1 if per_block else 12) + 5
        # forward gathers every parameter; backward only those released since (_kept_params stay gathered)
        regather = 1.0 - min(1.0, _kept_params(plan, param_groups(plan.model)["block"]) / params)
        out.update(param_gather=(1 + regather) * m * all_gather(grads, dp), grad_reduce=m * all_gather(red, dp),
                   collectives=2 * m * modules + m * _reduce_buckets_count(plan, params, comm),
                   hooks=out["hooks"] + m * (FETCH_OPS * modules + (0 if s.deepcompile else PARAM_OPS * n)),
                   # each backward's epilogue waits for its reduce stream (stage3.py), unless DeepCompile reduces
                   syncs=out["syncs"] + (0 if s.deepcompile else m))
    out["device_bytes"] = cast
    if s.offload_optimizer != "none":  # gradients out, updated parameters in, the Adam step on the host
        out.update(offload=(elem + 2) * params / dp, host_adam=params / dp)
    if s.offload_param != "none":  # the shard copied in before each gather
        out["offload"] = out.get("offload", 0.0) + 2 * m * grads / dp
    return out


def _reduce_buckets_count(plan: Plan, params: float, comm: tuple[tuple[int, float], ...]) -> int:
    """Reduce buckets of reduce_bucket_size elements, one set per communication dtype (``_comm_dtypes``)."""
    return sum(buckets(params * share, plan.strategy.reduce_bucket_size) for _, share in comm)


def label(name: str, v: dict) -> list[str]:
    """zero-<stage>, and where the optimizer states / parameters were offloaded."""
    head = f"{name}-{knob_text(v['zero_stage'])}" if v.get("zero_stage") is not None else name
    return [head] + [f"{k}={v[k]}" for k in ("offload_optimizer", "offload_param") if v.get(k) not in (None, "none")]


def implementation(plan: Plan):
    """DeepSpeed's engine (bench/strategies/zero_engine.py), imported where a rank builds it: validation, the planner and
    the analysis read this module and never import torch or DeepSpeed."""
    from bench.strategies.zero_engine import Zero

    return Zero


SPEC = register(StrategySpec(
    name="zero", schema=ZeroConfig, summary="DeepSpeed ZeRO stages 0-3 (+ CPU offload) on bench's model",
    implementation=implementation, rules=rules, model_states=model_states, buffers=buffers, label=label,
    phase_buffers=phase_buffers, traffic=traffic, variants_figure=("zero_stage", "ZeRO stages"), loss_chunks=True,
    grad_reduce={"fp32": ("strategy.reduce_dtype", "fp32"), "16bit": ("strategy.reduce_dtype", "param")},
    # each stage is a strategy of its own (the analysis, the store of measured bests): a knob search that leaves the
    # stage unset searches every stage, each with its own trials and winner
    search_bases={"strategy.zero_stage": (0, 1, 2, 3)},
    # deepspeed.initialize imports TorchInductor (its Muon optimizer module compiles at import; 0.7 s of its
    # ~1.5 s on the CPU machine); importing deepspeed took 1.76-2.10 s a rank there.  Its import asks
    # torch.cuda.device_count(), which reads NVML and starts no CUDA where NVML answers (torch's note on it; a fork
    # after it starts CUDA on an H100: results/2026-12-06-h100x1-deepspeed-preload).
    preload=lambda strategy: ("torch._inductor.compile_fx", "deepspeed"),  # the same for every knob: reads none
    profiles={"best": {
        "strategy.autocast": (True, "one H200, 300m bf16: ZeRO-0 77% -> 96% of single, same losses "
                                    "(results/2026-11-23-h200x2-ddp-ceiling-graph-exit)"),
        "compile": (True, "1 x H100, Llama 3.2 1B ZeRO-1 under autocast, 2 micro-batches: eager 44,067 -> compiled "
                          "51,147 tokens/s, one call (results/2026-12-06-h100x1-zero-memory)"),
        "compile_mode": ("reduce-overhead", "2 x H200, 300m: ZeRO-1/2 45% / 48% -> 84.5% / 83.7% of 2 x single; gpt2 "
                         "fp16 ZeRO-0 on one H200 169k -> 243k tokens/s (results/2026-11-23-h200x2-zero-fsdp-tp-pp, "
                         "results/2026-11-23-h200-compile-mode-zero-profiles)"),
        "strategy.compute_grad_norm": (False, "2 x H200, 300m, with CUDA graphs: ZeRO-1/2 89.7-92.7% of 2 x single "
                                              "against 76.8-84.5% (results/2026-11-23-h200x2-zero-grad-norm-fsdp)"),
        "strategy.leaf_blocks": (True, "one H200, 300m batch 8: ZeRO-3 24.6k -> 48.1k tokens/s, same losses "
                                       "(results/2026-11-23-h200-zero3-leaf-deepcompile)"),
    }},
))

"""The memory plan: predicted peak device memory per rank, before anything is launched.

peak allocated (what ``torch.cuda.max_memory_allocated`` measures: the largest rank's) =
    model states (parameters + gradients + optimizer states of this rank)
  + the larger of (when backward starts: the saved activations of the in-flight micro-batches and the pass's
                   buffers, beside the loss' logits buffers and autocast's weight copies, or, after the first
                   gradient, beside the backward's buffers [+ the gradients, when they outlive a micro-batch:
                   accumulation, pipelines, buffers allocated up front]) and
                  (the gradients, beside the optimizer step's temporaries or the backward's last buffers: end of
                  backward / step)
  + the strategy's persistent buffers (DDP's buckets, ZeRO-3's reduce buckets, FSDP2's gathered units)
  + cuBLAS's workspace (32 MiB), and never less than rank 0's matmul-peak probe (two 8192^2 bf16 matrices
    and their product, measured before the run when metrics.measure_matmul_peak)

* Model states: the ZeRO paper's bytes per parameter (Rajbhandari et al. 2020) by how the strategy
  holds them (``StrategySpec.model_states``): mixed 16-bit (2 + 2 + 12), fp32 weights with a torch
  optimizer (4 + 4 + 8), ...; ZeRO stage s over dp ranks (FSDP2: dp x cp, ``Layout.state_shards``) divides the
  optimizer (s >= 1), the gradients (s >= 2) and the parameters (s = 3); offload moves parts to the host.
  Parameters per rank follow the layout: blocks / pp and their matrices / tp, the embedding on the first stage
  and the head on the last; a pipeline's first and last stages are both planned, the larger is the peak.
* Activations per transformer layer and micro-batch of b sequences of s tokens (s = seq_len / cp: context
  parallelism holds a shard of each sequence; the ring's K / V beside them, ``cp_ring_bytes``) (Korthikanti et al.
  2022, "Reducing Activation Recomputation in Large Transformer Models", section 4, counted for
  bench's model: fused attention (no s x s scores), no dropout), each saved tensor once: the norm
  inputs, the projections' inputs (eager autocast: one 16-bit cast per projection; compiled or
  torch-native TP: one per norm output), q / k / v and the attention output (which o_proj saves as its
  input), the MLP's intermediates (GELU: 2 x d_ff; SwiGLU: 4 x d_ff, 3 compiled).  Tensor parallelism
  splits all but the norms' and projections' inputs (those too with sequence parallelism).  precision=fp8
  (compiled, tensorwise / rowwise): the Linear layers torchao converts save their inputs (q / k / v's and
  gate / up's shared ones, down's) as float8 casts, 1 B (``float8_input_bytes``; o_proj's is the attention
  output, which the fused kernel keeps in bf16); rowwise_with_gw_hp's stay bf16.  An implementation whose layer
  keeps more says how much (``ModelStates.extra_saved_per_token``: megatron-core's fused QKV output and GLU copy).
  ``recompute=full`` keeps one block input per layer, and one layer is recomputed in backward; ``op`` keeps
  the block input and the saved ops' outputs (bench/models/model_spec.py ``op_saved_per_token``: q, v and the
  MLP's first projection's outputs, the down projection's too in eager, the attention output and its log-sum-exp),
  and one layer's others are recomputed in backward (counted as full's: an upper bound);
  ``selective`` recomputes only the attention core, whose s x s scores the fused kernel never stores: the
  same prediction as none.  Pipelines: 1F1B min(m, pp) micro-batches on the first stage, one on the last;
  GPipe all m.
* Autocast's 16-bit copies of the fp32 matmul weights (2 B per parameter): each Linear saves its copy for backward
  (full recompute: the head's); all are cached to the forward's end, beside the loss' (bench/costs/forward_end.py).
  precision=fp8: the bf16 head's only (the compiled backward casts each converted weight again).
* Logits: b x s x vocab per micro-batch on the stage with the head, what the loss holds when its backward
  runs (``ModelStates.loss_bytes_per_logit``): torch's fp32 cross entropy 12 B (log-softmax output, its
  gradient, the fp32 logits' gradient), Megatron's in-place vocab-parallel one 6.
* FSDP2 gradient accumulation (``ModelStates.accum_grad_bytes``): with gradient sync off on all but the last
  micro-batch FSDP2 keeps every parameter's unsharded gradient in the reduce dtype (fp32: 4 B) from the first
  micro-batch's backward on, in place of the sharded gradients: beside the later micro-batches' activations.
* Strategy buffers by phase (``StrategySpec.buffers`` / ``phase_buffers``): DDP's reducer buckets and the
  first step's (with accumulation, the first micro-batch's own gradients too), ZeRO's reduce buckets (whole, per
  communication dtype, in backward for stages 1-2), FSDP2's reduce-scatter input (one unit's gradients, after that
  unit's backward: beside the other blocks' activations), ZeRO-3's gathered parameters, ZeRO's step (the flattened
  gradient partition and its fp32 copy).

Not in the allocated peak, but in what must fit on the device (``needed``, bench/plan/memory_margins.py: each margin
and where its number comes from): the allocator's fragmentation, a captured step's CUDA graph pool (its activations
and temporaries again, apart from the eager steps' cached blocks), the CUDA context and the NCCL communicators.
Predictions against every recorded run's measured peak: ``python -m multirun_analysis.prediction results/``.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from bench.machine.hardware import HardwareConfig, resolve as resolve_hardware
from bench.plan.memory_margins import (CONTEXT_BYTES, FRAGMENTATION, TIGHT, graph_pool_bytes, margins_text,  # noqa: F401
                                  outside_allocator_bytes, verdict)
from bench.models.model_spec import describe_model
from bench.parallel.float8 import fsdp_float8_all_gather
from bench.costs.activations import activation_bytes, params_per_rank
from bench.strategies.registry import FP32, ModelStates, get_spec
from bench.spec.schema import Plan

GIB, MB = 2**30, 2**20
# torch's default cuBLAS workspace on Hopper (CUBLAS_WORKSPACE_CONFIG=:4096:8), from the caching allocator
CUBLAS_WORKSPACE_BYTES = 8 * 4 * MB
# bench/launch/worker.py measure_matmul_peak: two 8192 x 8192 bf16 matrices and their product
PROBE_BYTES = 3 * 8192 * 8192 * 2
# offload: the host holds the offloaded states of every rank of the node, plus each rank's own process
# (torch, CUDA, DeepSpeed's pinned staging buffers); the OS and page cache keep the rest.
HOST_PER_RANK_BYTES, HOST_USABLE = 4 * GIB, 0.9

_PARTS = ("params", "grads", "optimizer")


# ------------------------------------------------------------------------------ parameters
# ------------------------------------------------------------------------------ model states
def model_state_bytes(plan: Plan, psi: float, lay: ModelStates) -> tuple[dict, dict]:
    """(device bytes, host bytes) of this rank's model states held as ``lay`` says, psi parameters on it."""
    bp, bg, bo = lay.scheme.bytes
    dp, stage = plan.layout.state_shards, lay.stage  # HSDP: the ranks of one replica; x cp
    size = {"params": bp * psi / (dp if stage >= 3 else 1), "grads": bg * psi / (dp if stage >= 2 else 1),
            "optimizer": bo * psi / (dp if stage >= 1 else 1)}
    where = {"params": lay.offload_param, "grads": lay.offload_grads, "optimizer": lay.offload_optimizer}
    device = {k: 0.0 if where[k] else size[k] for k in _PARTS}
    host = {k: size[k] if where[k] else 0.0 for k in _PARTS}
    if lay.unsharded_params_live:  # FSDP2 without reshard: every unit's gathered params live through the step
        device["params"] += gathered_param_bytes(plan, psi, lay)
    if lay.host_fp32_grad_partition:  # DeepSpeed optimizer offload: the fp32 gradient partition on the host
        host["grads"] += 4 * psi / dp
    return device, host


def gathered_param_bytes(plan: Plan, psi: float, lay: ModelStates) -> float:
    """Every unit's gathered parameters (FSDP2 without resharding): 16-bit (fp32 under fp32), but where FSDP2 gathers
    the converted Linear weights in float8 (precision=fp8, bench/parallel/float8.py) those are 1 B each: the blocks'
    matmul weights of the rank (float8_matmul_params over pp and tp); the norms, embedding and head stay 16-bit."""
    if lay.scheme == FP32:
        return 4 * psi
    f8 = describe_model(plan.model).float8_matmul_params() / (plan.pp * plan.tp) \
        if fsdp_float8_all_gather(plan) else 0.0
    return 2 * (psi - f8) + f8


# ------------------------------------------------------------------------------ the plan
def plan_hardware(plan: Plan) -> Optional[HardwareConfig]:
    """The plan's hardware preset with its overrides applied (bench/machine/hardware.py ``resolve``); None for auto."""
    return resolve_hardware(plan.run)


def device_memory_gib(plan: Plan, gpu_memory_gib: Optional[float] = None) -> tuple[Optional[float], str]:
    """The memory a rank may use: memory_gib, else the hardware preset's, else the launcher's / the visible
    GPU's; None on CPU."""
    if plan.run.memory_gib:
        return float(plan.run.memory_gib), "memory_gib"
    preset = plan_hardware(plan)
    if preset is not None and preset.memory_gib:
        return float(preset.memory_gib), f"hardware={preset.name}"
    if gpu_memory_gib:
        return gpu_memory_gib, "launcher"
    if plan.device != "cuda":
        return None, "CPU run: no device memory to check"
    import torch

    if not torch.cuda.is_available():  # planned elsewhere (a sweep for a SLURM cluster, a test)
        return None, "no visible GPU: set memory_gib to check the plan"

    props = torch.cuda.get_device_properties(0)
    return props.total_memory / GIB, props.name


def host_memory_gib(plan: Optional[Plan] = None) -> Optional[float]:
    """The node's RAM: the hardware preset's, else this machine's (the node a local run uses; for SLURM, the
    planning node's: an estimate)."""
    preset = plan_hardware(plan) if plan is not None else None
    if preset is not None and preset.host_memory_gib:
        return float(preset.host_memory_gib)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def _ranks_on_node(plan: Plan) -> int:
    if plan.device != "cuda":
        return 1
    preset = plan_hardware(plan)
    per_node = preset.gpus_per_node if preset is not None and preset.gpus_per_node else plan.world_size
    return min(plan.world_size, per_node)


def transient_bytes(plan: Plan, lay, grads: float, act: dict, phase: dict, accum: float = 0.0) -> tuple[float, float]:
    """What comes and goes within a step, at its largest: when backward starts, the saved activations and the
    pass's buffers, beside the loss' logits buffers and autocast's weight copies, or (after the first gradient)
    beside the backward's buffers and the copies or the layer being recomputed; the gradients too where they
    outlive a micro-batch.  At the end of backward and in the optimizer step: the gradients beside the step's
    temporaries (or the backward's buffers, where the gradient hooks run only after the whole backward).
    ``accum``: unsharded gradients kept between micro-batches in place of the sharded ones (FSDP2).  Returns (that
    largest, the forward-backward's own part: what a CUDA graph capture of it keeps in its pool)."""
    bwd, step = phase.get("backward", 0.0), phase.get("step", 0.0)
    early, late = (0.0, bwd) if lay.late_grad_hooks else (bwd, 0.0)
    # "reduce": allocated once the backward of the rank's last reduce_blocks blocks has run (their activations freed)
    reduce = phase.get("reduce", 0.0) - phase.get("reduce_blocks", 0) * act["activations"] / (
        act["microbatches_in_flight"] * act["layers_on_rank"])
    start = act["activations"] + phase.get("pass", 0.0) + act.get("cp_ring", 0.0) + max(act["forward_end"],
        act["logits"] + act["weight_copies"], early + max(act["recomputed_layer"], act["weight_copies"], reduce))
    grads_live = plan.grad_accum > 1 or plan.pp > 1 or lay.grads_live
    kept = accum if accum else (grads if grads_live else 0.0)
    return max(start + kept, grads + max(late, step, phase.get("end", 0.0))), start


def _workspace(plan: Plan) -> float:
    """cuBLAS's workspace, which torch takes from its caching allocator (counted as allocated)."""
    return CUBLAS_WORKSPACE_BYTES if plan.device == "cuda" else 0.0


def _probe(plan: Plan) -> float:
    """Rank 0's matmul-peak probe before the run (bench/launch/worker.py measure_matmul_peak, when
    metrics.measure_matmul_peak): its peak is in the run's max_memory_allocated too."""
    on = plan.device == "cuda" and plan.run.metrics.measure_matmul_peak
    return PROBE_BYTES + CUBLAS_WORKSPACE_BYTES if on else 0.0


def rank_peak(plan: Plan, spec, lay: ModelStates, stage: Optional[str] = None) -> dict[str, Any]:
    """The allocated peak of one rank (a pipeline's first or last stage; None: the one with more parameters) and
    its parts."""
    ranks = params_per_rank(plan, lay.tp_splits_vocab, stage)
    psi = ranks["params"]
    device, host = model_state_bytes(plan, psi, lay)
    act = activation_bytes(plan, lay, ranks)
    if act["host_activations"]:  # offload_activations: pinned host memory for the blocks' saved tensors
        host["activations"] = act["host_activations"]
    per_block = ranks["blocks"] / max(1, plan.model.n_layers / plan.pp)
    buf, buf_note = spec.buffers(plan, psi, per_block)
    phase, phase_note = spec.phase_buffers(plan, psi, per_block)
    accum = lay.accum_grad_bytes * psi if plan.grad_accum > 1 and not lay.offload_grads else 0.0
    transient, captured = transient_bytes(plan, lay, device["grads"], act, phase, accum)
    allocated = device["params"] + device["optimizer"] + transient + buf + _workspace(plan)
    return {"ranks": ranks, "psi": psi, "device": device, "host": host, "act": act, "buf": buf, "buf_note": buf_note,
            "phase": phase, "phase_note": phase_note, "allocated": max(allocated, _probe(plan)),
            "accum_grads": accum, "graph_pool": graph_pool_bytes(plan, lay.cuda_graph_pool, captured)}


def memory_plan(plan: Plan, gpu_memory_gib: Optional[float] = None) -> dict:
    """The predicted memory of the largest rank of a plan (module docstring), in MiB, with its parts."""
    spec = get_spec(plan.strategy.name)
    lay = spec.model_states(plan.run)
    peaks = [rank_peak(plan, spec, lay, stage) for stage in (("first", "last") if plan.pp > 1 else (None,))]
    r = max(peaks, key=lambda x: x["allocated"])
    ranks, psi, device, host, act, buf, phase = (r[k] for k in ("ranks", "psi", "device", "host", "act", "buf", "phase"))
    buf_note, phase_note, allocated = r["buf_note"], r["phase_note"], r["allocated"]
    mem_gib, source = device_memory_gib(plan, gpu_memory_gib)
    outside = outside_allocator_bytes(plan, lay.extra_communicators)
    v = verdict(allocated, r["graph_pool"] + outside, mem_gib)  # bench/plan/memory_margins.py
    crowd = spec.crowded(plan, allocated, mem_gib) if v["fits"] else None  # the strategy's own measured limit
    needed, fits_, tight = v["needed"], v["fits"], v["tight"] or bool(crowd)
    host_needed = sum(host.values()) * _ranks_on_node(plan) + (HOST_PER_RANK_BYTES * _ranks_on_node(plan)
                                                                 if any(host.values()) else 0)
    host_gib = host_memory_gib(plan)
    host_fits = None if not any(host.values()) or host_gib is None else host_needed <= HOST_USABLE * host_gib * GIB
    mib = lambda x: round(x / MB, 1)  # noqa: E731
    summary = (f"predicted peak {allocated / GIB:.1f} GiB allocated, {needed / GIB:.1f} GiB needed "
               f"(states {(device['params'] + device['grads'] + device['optimizer']) / GIB:.1f}, activations "
               f"{(act['activations'] + act['logits']) / GIB:.1f}, buffers {buf / GIB:.1f})"
               + (f" of {mem_gib:.0f} GiB" if mem_gib else "")
               + (f" - tight: within the plan's {round(100 * TIGHT)}% error of the limit, it may run out of memory"
                  if v["tight"] else f" - tight: {crowd}" if crowd else "")
               + (f"; host {host_needed / GIB:.1f} GiB for what is offloaded, of {host_gib:.0f} GiB"
                  if host_fits is not None else ""))
    return {
        "parameters": describe_model(plan.model).total_params(), "parameters_on_rank": round(psi),
        "peak_stage": ranks["stage"], "flops_per_token": describe_model(plan.model).flops_per_token(),
        "layout": {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp_size, "micro_batch_size": plan.micro_batch_size,
                   "microbatches": plan.grad_accum, "recompute": plan.layout.recompute,
                   **({"cp": plan.cp} if plan.cp > 1 else {}),
                   **({"loss_chunks": plan.layout.loss_chunks} if plan.layout.loss_chunks > 1 else {}),
                   **({"offload_activations": True} if plan.layout.offload_activations else {})},
        "model_states": {"scheme": lay.scheme.name, "stage": lay.stage, "note": lay.note,
                         "bytes_per_param": lay.scheme.bytes,
                         "device_mb": {k: mib(v) for k, v in device.items()},
                         "host_mb": {k: mib(v) for k, v in host.items()}},
        "activations": {**{k: v for k, v in act.items() if k not in ("activations", "logits")},
                        "per_layer_per_microbatch_mb": mib(act["per_layer_per_microbatch"]),
                        "activations_mb": mib(act["activations"]), "logits_mb": mib(act["logits"])},
        "buffers_mb": mib(buf), "buffers_note": buf_note,
        "phase_buffers_mb": {k: mib(v) for k, v in phase.items() if k != "reduce_blocks"},  # a count, not bytes
        "phase_buffers_note": phase_note,
        "predicted_peak_allocated_mb": mib(allocated),
        "allowance": margins_text(), "accumulated_grads_mb": mib(r["accum_grads"]),
        "outside_allocator_mb": {"cuda_graph_pool": mib(r["graph_pool"]), "context_and_nccl": mib(outside)},
        "needed_mb": mib(needed), "worst_needed_mb": mib(v["worst"]), "device_memory_gib": mem_gib, "device_memory_source": source,
        "fits": fits_, "tight": tight, "host_needed_mb": mib(host_needed), "host_memory_gib": host_gib,
        "host_fits": host_fits, "summary": summary,
    }


def fits(mem: dict, plan: Plan) -> Optional[str]:
    """None when the plan fits (or there is nothing to check), else the skip reason."""
    if mem.get("host_fits") is False:
        return (f"predicted host OOM (what is offloaded needs {mem['host_needed_mb'] / 1024:.3g} GiB of the host's "
                f"{mem['host_memory_gib']:.3g} GiB, {int(100 * HOST_USABLE)}% usable): {mem['summary']}; "
                "force_run=true runs it anyway")
    if mem.get("fits") is not False:
        return None
    return (f"predicted OOM (needs {mem['needed_mb'] / 1024:.3g} GiB of {mem['device_memory_gib']:.3g}: "
            f"the allocated peak, fragmentation, CUDA graph pools, the CUDA context and NCCL communicators): "
            f"{mem['summary']}; force_run=true runs it anyway")

"""The memory plan: predicted peak device memory per rank, before anything is launched.

peak allocated (what ``torch.cuda.max_memory_allocated`` measures: the largest rank's) =
    model states (parameters + gradients + optimizer states of this rank)
  + the larger of (when backward starts: the saved activations of the in-flight micro-batches and the pass's
                   buffers, beside the loss' logits buffers and autocast's weight copies, or, after the first
                   gradient, beside the backward's buffers [+ the gradients, when they outlive a micro-batch:
                   accumulation, pipelines, buffers allocated up front]) and
                  (the gradients, beside the optimizer step's temporaries: end of backward / step)
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
  output, which the fused kernel keeps in bf16); rowwise_with_gw_hp's stay bf16.
  ``recompute=full`` keeps one block input per layer, and one layer is recomputed in backward;
  ``selective`` recomputes only the attention core, whose s x s scores the fused kernel never stores: the
  same prediction as none.  Pipelines: 1F1B min(m, pp) micro-batches on the first stage, one on the last;
  GPipe all m.
* Autocast's 16-bit copies of the fp32 matmul weights (2 B per parameter): each Linear saves its copy for backward
  (full recompute: the head's); all are cached to the forward's end, beside the loss' (bench/plan/forward_end.py).
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

from bench.machine.hardware import resolve as resolve_hardware
from bench.plan.memory_margins import (CONTEXT_BYTES, FRAGMENTATION, TIGHT, graph_pool_bytes, margins_text,  # noqa: F401
                                  outside_allocator_bytes, verdict)
from bench.models.model_spec import describe_model
from bench.plan.forward_end import forward_end_bytes
from bench.parallel.float8 import fsdp_float8_all_gather, saves_float8_inputs
from bench.strategies.registry import FP32, ModelStates, get_spec
from bench.plan.traffic import RING_GRAD_BYTES, compute_bytes, kv_bytes, local_tokens
from bench.run.schema import Plan

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
def params_per_rank(plan: Plan, tp_splits_vocab: bool, stage: Optional[str] = None) -> dict[str, float]:
    """Parameters on a pipeline stage of this layout ("first" or "last"; None: the larger one), per
    tensor-parallel rank."""
    m, tp, pp = plan.model, plan.tp, plan.pp
    desc = describe_model(m)
    g = desc.param_groups()
    norms_per_block = desc.norm_params_per_block()  # replicated over tp
    block = (g["block"] - norms_per_block) / tp + norms_per_block
    blocks = block * m["n_layers"] / pp
    vocab_div = tp if tp_splits_vocab else 1
    emb = g["embedding"] / vocab_div
    # a tied head is the embedding itself, except on a pipeline's last stage, which holds a copy
    head = (0 if g["tied"] and pp == 1 else g["head"]) / vocab_div
    first = emb + blocks + (g["norm"] + head if pp == 1 else 0)
    last = blocks + g["norm"] + head
    stage = stage or ("first" if first >= last or pp == 1 else "last")
    own = first if stage == "first" else last
    # the head's matmul weight (d x V / tp), a copy of the tied embedding too, on the stage that computes the loss
    head_matmul = g["head"] / vocab_div if pp == 1 or stage == "last" else 0.0
    return {"params": own, "stage": stage, "blocks": blocks, "embedding_and_head": own - blocks, "head": head_matmul}


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


# ------------------------------------------------------------------------------ activations
def _act_dtypes(plan: Plan, lay) -> tuple[int, int, int]:
    """(bytes of a saved activation, bytes of a norm input, projection-input copies per consumer (1: one
    16-bit cast per projection under eager autocast, 0: one shared tensor)) for how this run computes."""
    if plan.cfg["precision"] == "fp32":
        return 4, 4, 0
    if lay.sixteen_bit_weights:
        return 2, 2, 0
    # compiled, Inductor casts a norm's output once for all the projections that read it
    return 2, 4, 0 if plan.cfg.get("compile") or lay.shared_input_casts else 1


def float8_input_bytes(plan: Plan, act: int, per_consumer: int) -> int:
    """Bytes per element of the input a converted Linear saves for backward: 1 where it saves a float8 cast
    (precision=fp8, compiled, tensorwise / rowwise: bench/parallel/float8.py saves_float8_inputs), else the
    activation's (bf16 runs; rowwise_with_gw_hp; eager per-projection casts, where torchao saves its bf16 input)."""
    return 1 if saves_float8_inputs(plan.cfg) and not per_consumer else act


def layer_activation_bytes(plan: Plan, b: int, lay) -> dict[str, float]:
    """Saved activations of one transformer layer for a micro-batch of b sequences (module docstring);
    ``float8_saved``: what precision=fp8's float8-saved Linear inputs take off them (0 otherwise)."""
    m, tp = plan.model, plan.tp
    d = m["d_model"]
    e = describe_model(m).saved_per_token(bool(plan.cfg.get("compile")))  # elements, by kind (bench/models/model_spec.py)
    act, norm_in, per_consumer = _act_dtypes(plan, lay)
    lin = float8_input_bytes(plan, act, per_consumer)  # a converted Linear's saved input: q/k/v, gate/up, down
    tokens = b * m["seq_len"] // plan.cp  # the rank's shard of each sequence under context parallelism
    # replicated over tp (split too with sequence parallelism): the two norms' inputs and the projections' inputs
    sp = tp if lay.sequence_parallel else 1
    norms = e.norm_inputs * norm_in / sp
    inputs = (e.projection_inputs * act if per_consumer else e.shared_inputs * lin) / sp
    # split over tp: q, k, v and the attention output (one tensor: bf16 under fp8 too, the kernel's backward reads
    # it); the MLP's intermediates and its last projection's input
    attn = e.attention * act / tp
    mlp = (e.mlp * act + e.mlp_down_input * lin) / tp
    per_token = norms + inputs + attn + mlp
    saved = (0 if per_consumer else e.shared_inputs / sp + e.mlp_down_input / tp) * (act - lin)
    return {"per_token": per_token, "tokens": tokens, "bytes": tokens * per_token, "block_input": tokens * d * norm_in,
            "float8_saved": tokens * saved}


def in_flight_microbatches(plan: Plan, stage: str = "first") -> int:
    """Micro-batches whose activations a pipeline stage holds at its peak: GPipe all; 1F1B min(m, pp) on the first
    stage and one on the last (it runs each backward right after its forward); interleaved 1F1B the warm-up
    chunks of 1/v of the layers plus the running one."""
    if plan.pp == 1:
        return 1
    m, pp = plan.grad_accum, plan.pp
    sched, v = plan.layout.schedule, plan.layout.virtual_pipeline
    if sched == "gpipe":
        return m
    warmup = 2 * (pp - 1) if stage == "first" else 0  # rank r warms up 2 (pp - r - 1) + (v - 1) pp chunks
    if v > 1:
        return min(m, -(-(warmup + 1 + (v - 1) * pp) // v))
    return min(m, pp if stage == "first" else 1)


def autocast_copy_bytes(plan: Plan, lay, matmul_params: float) -> float:
    """torch.autocast's 16-bit copies of fp32 weights (every matmul weight and bias on the rank): the forward
    caches one per weight and each Linear saves it for its backward, so all are alive when backward starts."""
    if plan.cfg["precision"] == "fp32" or lay.sixteen_bit_weights:
        return 0.0
    return 2 * matmul_params


def weight_copy_bytes(plan: Plan, lay, ranks: dict) -> float:
    """The matmul weights' copies alive when backward starts: autocast's 16-bit ones; under precision=fp8, for the
    blocks' Linear layers torchao converts (bench/parallel/float8.py) their float8 copies instead, 1 B per
    parameter, counted for all of the rank's blocks: an upper bound (eager, torchao saves the fp32 / gathered
    weight and casts again in backward, one layer's copy alive at a time; compiled, Inductor may save them), and
    none where FSDP2 gathers in float8 (the gathered weight is the copy).  The head stays in bf16."""
    if plan.cfg["precision"] != "fp8":
        return autocast_copy_bytes(plan, lay, ranks["blocks"] + ranks["head"])
    return autocast_copy_bytes(plan, lay, ranks["head"]) + (0.0 if fsdp_float8_all_gather(plan) else ranks["blocks"])


def activation_bytes(plan: Plan, lay, ranks: Optional[dict] = None) -> dict[str, Any]:
    """Saved activations of the in-flight micro-batches, the loss' logits buffers, and what backward's start
    adds to them: autocast's weight copies, or (full recompute) one layer recomputed with its copies."""
    m, b = plan.model, plan.micro_batch_size
    ranks = ranks or params_per_rank(plan, lay.tp_splits_vocab)
    layer = layer_activation_bytes(plan, b, lay)
    layers = m["n_layers"] / plan.pp
    k = in_flight_microbatches(plan, ranks["stage"])
    mode = plan.layout.recompute
    copies = weight_copy_bytes(plan, lay, ranks)
    head_copy = autocast_copy_bytes(plan, lay, ranks["head"])
    if mode == "full":  # checkpointed blocks keep their input; their copies are not saved (their forward runs again)
        ck = plan.layout.checkpointed(layers)  # all of them, or every recompute_every-th
        per_mb = ck * layer["block_input"] + (layers - ck) * layer["bytes"]
        recomputed = layer["bytes"] + (copies - head_copy) / layers  # the blocks' copies, one layer's at a time
        at_loss = head_copy + (copies - head_copy) * (layers - ck) / layers
    else:
        ck, per_mb, recomputed, at_loss = 0.0, layers * layer["bytes"], 0.0, copies
    saved = k * (layers - ck) * layer["float8_saved"]  # the float8-saved inputs' share (not of checkpointed blocks)
    vocab = m["vocab_size"] / (plan.tp if lay.tp_splits_vocab else 1)
    logits = layer["tokens"] * vocab * lay.loss_bytes_per_logit if ranks["head"] else 0.0
    ring = {"cp_ring": cp_ring_bytes(plan)} if plan.cp > 1 else {}
    fwd_end = forward_end_bytes(plan, copies, logits / lay.loss_bytes_per_logit)
    return {"layers_on_rank": layers, "microbatches_in_flight": k, "per_layer_per_microbatch": layer["bytes"],
            "recompute": mode, "activations": k * per_mb, "logits": logits, "weight_copies": at_loss,
            "recomputed_layer": recomputed, "float8_inputs_saving": saved, "forward_end": fwd_end, **ring}


def cp_ring_bytes(plan: Plan) -> float:
    """Context parallelism's ring attention (torch's, bench/parallel/cp.py) in one layer's backward, beside the saved
    activations: the whole sequence's K and V gathered again (compute dtype) and the rank's chunk of them
    concatenated to send; the chunk's dK / dV in fp32 three times (accumulated, concatenated to send, received from
    the ring's neighbour) and dQ's fp32 accumulator.  The forward holds less (the gathered K / V and the chunk)."""
    kv, cp, fp32 = kv_bytes(plan), plan.cp, RING_GRAD_BYTES
    dq = local_tokens(plan) * plan.model["d_model"] / plan.tp * fp32
    return kv * (1 + 1 / cp) + 3 * kv / cp * fp32 / compute_bytes(plan) + dq


# ------------------------------------------------------------------------------ the plan
def device_memory_gib(plan: Plan, gpu_memory_gib: Optional[float] = None) -> tuple[Optional[float], str]:
    """The memory a rank may use: memory_gib, else the hardware preset's, else the launcher's / the visible
    GPU's; None on CPU."""
    if plan.cfg.get("memory_gib"):
        return float(plan.cfg["memory_gib"]), "memory_gib"
    preset = resolve_hardware(plan.cfg)
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
    preset = resolve_hardware(plan.cfg) if plan is not None else None
    if preset is not None and preset.host_memory_gib:
        return float(preset.host_memory_gib)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def _ranks_on_node(plan: Plan) -> int:
    if plan.device != "cuda":
        return 1
    preset = resolve_hardware(plan.cfg)
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
    return max(start + kept, grads + max(late, step)), start


def _workspace(plan: Plan) -> float:
    """cuBLAS's workspace, which torch takes from its caching allocator (counted as allocated)."""
    return CUBLAS_WORKSPACE_BYTES if plan.device == "cuda" else 0.0


def _probe(plan: Plan) -> float:
    """Rank 0's matmul-peak probe before the run (bench/launch/worker.py measure_matmul_peak, when
    metrics.measure_matmul_peak): its peak is in the run's max_memory_allocated too."""
    on = plan.device == "cuda" and (plan.cfg.get("metrics") or {}).get("measure_matmul_peak", False)
    return PROBE_BYTES + CUBLAS_WORKSPACE_BYTES if on else 0.0


def rank_peak(plan: Plan, spec, lay: ModelStates, stage: Optional[str] = None) -> dict[str, Any]:
    """The allocated peak of one rank (a pipeline's first or last stage; None: the one with more parameters) and
    its parts."""
    ranks = params_per_rank(plan, lay.tp_splits_vocab, stage)
    psi = ranks["params"]
    device, host = model_state_bytes(plan, psi, lay)
    act = activation_bytes(plan, lay, ranks)
    per_block = ranks["blocks"] / max(1, plan.model["n_layers"] / plan.pp)
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
    spec = get_spec(plan.strategy["name"])
    lay = spec.model_states(plan.cfg)
    peaks = [rank_peak(plan, spec, lay, stage) for stage in (("first", "last") if plan.pp > 1 else (None,))]
    r = max(peaks, key=lambda x: x["allocated"])
    ranks, psi, device, host, act, buf, phase = (r[k] for k in ("ranks", "psi", "device", "host", "act", "buf", "phase"))
    buf_note, phase_note, allocated = r["buf_note"], r["phase_note"], r["allocated"]
    mem_gib, source = device_memory_gib(plan, gpu_memory_gib)
    outside = outside_allocator_bytes(plan, lay.extra_communicators)
    v = verdict(allocated, r["graph_pool"] + outside, mem_gib)  # bench/plan/memory_margins.py
    needed, fits_, tight = v["needed"], v["fits"], v["tight"]
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
                  if tight else "")
               + (f"; host {host_needed / GIB:.1f} GiB for offloaded states of {host_gib:.0f} GiB"
                  if host_fits is not None else ""))
    return {
        "parameters": describe_model(plan.model).total_params(), "parameters_on_rank": round(psi),
        "peak_stage": ranks["stage"], "flops_per_token": describe_model(plan.model).flops_per_token(),
        "layout": {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp_size, "micro_batch_size": plan.micro_batch_size,
                   "microbatches": plan.grad_accum, "recompute": plan.layout.recompute,
                   **({"cp": plan.cp} if plan.cp > 1 else {})},
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
        return (f"predicted host OOM (offloaded states need {mem['host_needed_mb'] / 1024:.3g} GiB of the host's "
                f"{mem['host_memory_gib']:.3g} GiB, {int(100 * HOST_USABLE)}% usable): {mem['summary']}; "
                "force_run=true runs it anyway")
    if mem.get("fits") is not False:
        return None
    return (f"predicted OOM (needs {mem['needed_mb'] / 1024:.3g} GiB of {mem['device_memory_gib']:.3g}: "
            f"the allocated peak, fragmentation, CUDA graph pools, the CUDA context and NCCL communicators): "
            f"{mem['summary']}; force_run=true runs it anyway")

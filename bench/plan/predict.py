"""Throughput prediction: the step time of a plan on a GPU, from first principles with a few constants
calibrated on recorded runs (bench/calibrate.py writes bench/plan/calibration.json, read here).

One optimizer step of the slowest rank, in seconds::

  compute  = F / (peak x measured share x e(x))       matmuls: the FLOPs the rank runs (recompute included, less
                                                       the last matmul of a block torch's checkpoint does not
                                                       rerun: metrics/flops.py executed_flops_per_token) but
                                                       causal attention's;
                                                       the peak a probe measured, or a datasheet's at the share
                                                       runs measure (MEASURED_OVER_DATASHEET);
                                                       fp8: the float8 matmuls' share at the fp8 peak (_peak),
                                                       on e(x) at x bf16 / fp8 (_float8_split)
               e(x) = e_max x / (x + x_half)           x = a rank's tokens per micro-batch (seq_len / cp a
                                                       sequence) x d_model / tp (matmul size),
                                                       x REFERENCE_MATMUL_FLOPS / the GPU's bf16 matmul rate
           + A / (peak x measured share x e_max x a(s))  causal attention: the FLOPs its kernels run, forward and
                                                       backward each at its measured share of a large matmul's
                                                       rate under the same clocks, share x s / (s + seq_half)
                                                       (hardware.attention; bf16's peak under fp8); s = seq_len / cp
           + passes x activation bytes / HBM x (fused if compiled)   elementwise work, memory bound
           + 1.75 x model-state bytes / HBM                          the AdamW step (reads p g m v, writes p m v)
           + fp8_cast x float8 cast bytes / HBM                      fp8: casting each converted Linear's input and
                                                                     output gradient (3 bytes an element: read bf16,
                                                                     write float8; amax and transposes in fp8_cast)
           + device bytes / HBM                      the strategy's own memory-bound work (StrategySpec.traffic
                                                     "device_bytes": FSDP2's float8 weight casts before each gather)
  comm     = exposed(grad_reduce, BACKWARD_SHARE x compute, grad_exposed)
           + exposed(param_gather, compute - what the reduction hid behind, param_exposed)
           + (tail + activation + p2p + context) / link'
           + 20 us x collectives + offload / PCIe
             exposed(w, window, share) = max(w' - window, 0) + share x min(w', window), w' = w / link':
             what overlaps costs its exposed share while compute lasts, and all of it beyond (a slow link's
             reduction outlasts the backward it hides behind)
             link' = a datasheet link x link_eff (fitted: NCCL's share of the datasheet, and NVLink's losses at
             a step's message sizes); a link given as NCCL's bus bandwidth (a probe's, a PCIe preset's) as it
             is, at the step's typical message size on the probe's curve (link_terms.measured_link, link_curve;
             where the probe measured smaller groups of a node, each kind on its own group's curve)
             bytes per kind from the strategy (StrategySpec.traffic, bench/costs/traffic.py); the link is the bus
             bandwidth of the group each kind travels over (bench/plan/topology.py: TP inside a node, a data-parallel
             group across nodes costed hierarchically, HSDP's gradient and parameter traffic over its shard group and
             the replicas' all-reduce over its replicate group, pipeline sends at the network share once they
             cross nodes, context parallelism's K / V exchange over the cp group: waited on inside attention,
             all exposed)
  bubble   = (compute + comm) x (pp - 1) / (virtual x micro-batches)
  host     = host factor x (1 + lockstep x [ranks > 1 and host hooks] x meets)
             x (launch x (per_layer x layer_host x layers x micro-batches
             + per_microbatch x micro-batches) + per_step + per_hook x hooks)
             lockstep: ranks whose host work (hooks) meets at every per-layer collective wait for the slowest
             one each time, so a host-bound step is the slowest rank's, not the average's (measured: one
             host-bound FSDP2 rank sets the pace while the other's NCCL kernels wait,
             results/2026-11-23-h200x2-cpu-affinity); meets: the share of layer passes at which they meet
             (traffic "lockstep": 1, but ZeRO-1/2's hooks launch a reduction only once a bucket is full)
             launch: 1 eager, compiled_host with compile, graph_host with CUDA graphs; layer_host (eager
             only): the strategy's cost of a layer's ops against plain tensors' (DTensor dispatch)
  step     = max(G, H) + overlap x min(G, H) + per_sync x syncs + per_adam_param x host Adam parameters
             G = compute + comm + bubble (the device), H = host; overlap: how much of the shorter side
             the other does not hide (overlap_sync when the host waits on the device every step:
             step_timing=sync, fp16 overflow checks, a host read of the gradient norm)

The breakdown is compute_s, exposed_comm_s, bubble_s and host_s = step - G (what the host adds).

Hosts: host-bound runs move between hosts with the same GPU (the same gpt2 fp16 ZeRO-0 command ran at
157k tokens/s on one H100 host and 193-197k on another the same day).  H is therefore multiplied by a
host factor: the calibration fits one per recorded host (``host_key``: hostname and CPU count, since the
recorded hostname alone, "vm", names a VM image, not a machine: the machine shapes, 16 to 128 CPUs for 1
to 8 GPUs, are what it can tell apart), normalised so that the median host's is 1.  ``predict(plan,
host=key)`` uses a measured host's factor; an unmeasured host, or none named, gets the median's (1).  Two
machines of one shape stay one host: their spread is part of the measured error ``predict`` reports.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from bench.machine.hardware import DEFAULT_ATTENTION, HardwareConfig, match
from bench.plan.calibration_error import case_error, layout_error, regime_error
from bench.plan.link_terms import host_link_s, measured_link, regime_mismatch
from bench.plan.memory_model import MB, memory_plan, plan_hardware
from bench.models.model_spec import describe_model
from bench.metrics.flops import (causal_attention_flops_per_token, executed_flops_per_token,
                                float8_cast_elements_per_layer_token, float8_matmul_params, matmul_params)
from bench.spec.schema import Plan
from bench.strategies.registry import get_spec
from bench.plan.topology import Topology, topology
from bench.costs.traffic import BYTE_KINDS, local_tokens

CALIBRATION = Path(__file__).with_name("calibration.json")
OPTIMIZER_PASSES = 1.75  # fused AdamW: reads params, grads, m, v, writes params, m, v: 7 of 4 state parts
COLLECTIVE_LATENCY_S = 20e-6  # one NCCL collective's start-up inside a node (small-message latency)
# measured / datasheet bf16 matmul peak (an 8192^3 matmul, bench/launch/worker.py measure_matmul_peak): set by hand to the
# median over the recorded runs' rank 0 (metrics.json flops.matmul_peak_tflops_measured; their range on the day it
# was set: docs/results.md, "How the fit was chosen"); a datasheet preset's peaks are taken at this share, a probe's
# (measured) at their value
MEASURED_OVER_DATASHEET = 0.80
# the matmul rate the matmul-size constant x_half was fitted at: the recorded runs' GPUs (H100 / H200, bf16 989.4
# TFLOP/s datasheet) at the measured share.  A matmul's fixed cost (launch, the first wave's ramp) is a time, so the
# size at which it equals the work scales with the GPU's rate: on a GPU k times slower, x_half / k
REFERENCE_MATMUL_FLOPS = 989.4e12 * MEASURED_OVER_DATASHEET
# the share of a step's compute that gradient reductions issued during backward can hide behind (backward is two of
# the three matmul passes); parameter gathers are prefetched through forward and backward (the whole compute)
BACKWARD_SHARE = 2.0 / 3.0

# The fitted constants (values: bench/plan/calibration.json), each with its physical reading and what checks it; here the
# fit's starting point.  Set by hand, not fitted (python -m bench.calibrate's docstring says why): OPTIMIZER_PASSES,
# COLLECTIVE_LATENCY_S above, bench/machine/hardware.py DEFAULT_ATTENTION, bench/plan/link_terms.py
# HOST_LINK_GBPS; the strategies'
# host-operation counts (bench/costs/traffic.py DTENSOR_LAYER_HOST and the pipeline's 4 hooks per micro-batch, ZeRO's
# FETCH_OPS / PARAM_OPS, Megatron's PARAM_OPS, FSDP2's FLOAT8_CAST_HOOKS).
DEFAULTS = {
    # device: matmuls, memory-bound work, links
    "e_max": 0.9,  # fraction of the measured matmul peak (bf16 8192^3) the step's largest matmuls reach
    "x_half": 2e6,  # matmul size (tokens per micro-batch x d_model / tp) at which matmuls run at half e_max
    "passes": 4.0,  # HBM passes over the stored activation bytes for the unfused elementwise kernels of a step
    "fused": 0.5,  # share of those passes left once torch.compile fuses the elementwise kernels
    "link_eff": 0.7,  # achieved / datasheet link bandwidth; its physical reading is NCCL's all-reduce bus bandwidth
    #                   over the datasheet's (measured range: docs/results.md, "How the fit was chosen").  The fitted
    #                   value may fall outside that range: it also absorbs what the model leaves out of a step's
    #                   communication (python -m bench.calibrate prints it beside the others)
    "grad_exposed": 0.3,  # share of the overlapped gradient reduction that backward does not hide
    "param_exposed": 0.3,  # share of the overlapped parameter all-gathers that compute does not hide
    "fp8_cast": 4.0,  # HBM cost of a float8 cast (amax, scale, transposes) in units of its 3-byte read-and-write
    # host: the Python and launch work of a step, seconds (x the host's factor)
    "per_layer": 3e-4,  # launching one layer's kernels for one micro-batch, eager
    "per_microbatch": 1e-3,  # a micro-batch's launches outside the layers (embedding, head, loss, schedule)
    "per_step": 3e-3,  # a step's fixed host work (optimizer launch, zero_grad, timing)
    "compiled_host": 0.5,  # share of the launch work left under torch.compile (fewer, fused kernels)
    "graph_host": 0.05,  # share left under CUDA graphs (one replay per captured region)
    "per_hook": 2e-5,  # one framework host operation (a Python hook, a parameter's bookkeeping)
    "lockstep": 0.2,  # extra host time where ranks' hooks meet at per-layer collectives: the slowest rank's pace
    #                   (results/2026-11-23-h200x2-cpu-affinity)
    "per_sync": 1e-4,  # one host-device synchronisation: the launch queue drained and refilled
    "per_adam_param": 2e-9,  # the host's Adam step per parameter (optimizer offload: DeepSpeed cpu_adam)
    # how device and host time add up
    "overlap": 0.05,  # share of the shorter of device and host time that the longer does not hide
    "overlap_sync": 0.3,  # the same where the host waits on the device every step
}
# the roofline baseline (bench/calibrate.py prints its error beside the model's): no fitted constant, matmuls at
# the measured peak, one pass over the elementwise bytes, every byte exposed at the link's speed, no host time
ROOFLINE = {**{k: 0.0 for k in DEFAULTS}, "e_max": 1.0, "passes": 1.0, "fused": 1.0, "link_eff": 1.0,
            "grad_exposed": 1.0, "param_exposed": 1.0, "compiled_host": 1.0, "graph_host": 1.0, "fp8_cast": 1.0}
BOUNDED = ("e_max", "fused", "link_eff", "grad_exposed", "param_exposed", "compiled_host", "graph_host", "overlap",
           "overlap_sync")  # fractions in (0, 1)


def device_hardware(plan: Plan, hardware: Optional[HardwareConfig] = None) -> HardwareConfig:
    """The GPU a plan is predicted for: the argument, else the config's preset, else the visible GPU's."""
    hw = hardware or plan_hardware(plan)
    if hw is None and plan.device == "cuda":
        import torch

        hw = match(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
    if hw is None or not hw.peak_tflops or not hw.hbm_gbps:
        raise ValueError("no hardware to predict for: plan with hardware=<preset> (bench/machine/hardware.py), or pass one")
    return hw


def _peak(plan: Plan, hw: HardwareConfig) -> float:
    """The matmuls' peak FLOP/s at the run's precision.  precision=fp8: the converted matmuls' share of the FLOPs
    (float8_matmul_params: the blocks' Linear layers, forward and backward) at the fp8 peak, the rest (head,
    attention scores) at bf16's: the peak that gives their summed time (each part's efficiency: _float8_split)."""
    prec = plan.run.precision
    if prec == "fp8":
        bf16, fp8, share = _float8_rates(plan, hw)
        return 1e12 / (share / fp8 + (1 - share) / bf16)
    key = prec if prec != "fp32" else ("tf32" if plan.run.tf32 else "fp32")
    return float(hw.peak_tflops.get(key) or hw.peak_tflops["fp32"]) * 1e12


def _float8_rates(plan: Plan, hw: HardwareConfig) -> tuple[float, float, float]:
    """precision=fp8: the bf16 and fp8 peaks (TFLOP/s) and the converted matmuls' share of the FLOPs."""
    bf16 = float(hw.peak_tflops["bf16"])
    return bf16, float(hw.peak_tflops.get("fp8") or bf16), float8_matmul_params(plan.model) / matmul_params(plan.model)


def _float8_split(plan: Plan, hw: HardwareConfig, matmul_size: float) -> dict[str, float]:
    """The float8 matmuls' share of the matmul time at the peaks, and their size on e(x)'s scale.  A matmul's fixed
    cost (launch, the first wave's ramp) is a time, and a float8 matmul does its work fp8 / bf16 times faster
    (2 x on an H100 / H200), so it reaches a given efficiency only at that many times the size: the float8
    matmuls' size is the bf16 size x bf16 / fp8 (the argument REFERENCE_MATMUL_FLOPS makes across GPUs).
    Measured: precision=fp8 runs at 16.8M and 9.3M were 17-25% slower than a single e(x) predicted, tensorwise
    ones at 33.6M and over within 10% but two slowed by allocator retries (benchmarks/run_errors.py precision=fp8;
    docs/results.md).  0 and the size itself for others."""
    if plan.run.precision != "fp8":
        return {"fp8_time_share": 0.0, "matmul_size_fp8": matmul_size}
    bf16, fp8, share = _float8_rates(plan, hw)
    return {"fp8_time_share": (share / fp8) / (share / fp8 + (1 - share) / bf16),
            "matmul_size_fp8": matmul_size * bf16 / fp8}


def plan_topology(plan: Plan, hardware: Optional[HardwareConfig] = None) -> Topology:
    """The plan's groups placed on the hardware's nodes (bench/plan/topology.py)."""
    lay = plan.layout
    return topology(lay.tp, lay.pp, lay.dp, device_hardware(plan, hardware), lay.dp_replicate, lay.cp)


def terms(plan: Plan, hardware: Optional[HardwareConfig] = None) -> dict[str, float]:
    """What the step time is made of, before any calibrated constant: FLOPs, bytes, counts, rates."""
    hw = device_hardware(plan, hardware)
    mem = memory_plan(plan, gpu_memory_gib=hw.memory_gib)
    traffic = get_spec(plan.strategy.name).traffic(plan, float(mem["parameters_on_rank"]))
    topo = plan_topology(plan, hw)
    return {**_device_terms(plan, hw, mem, traffic), **_host_terms(plan, traffic),
            **{f"{k}_s": v for k, v in topo.seconds(traffic).items()},
            "offload_s": host_link_s(plan, hw, traffic, mem), **measured_link(hw, traffic, topo),
            "collectives": traffic.get("collectives", 0.0) + traffic.get("scalar_collectives", 0.0)}


def peak_ratio(hw: HardwareConfig) -> float:
    """Measured / stated matmul peak: 1 for a probe's profile (its peaks are measured), else the typical share of a
    datasheet's (MEASURED_OVER_DATASHEET), so that the fitted matmul efficiency is against a measured peak."""
    return 1.0 if hw.source == "probe" else MEASURED_OVER_DATASHEET


def _device_terms(plan: Plan, hw: HardwareConfig, mem: dict, traffic: dict) -> dict[str, float]:
    """FLOPs and peak (stated, and measured / stated), the matmul size, the memory-bound seconds at full HBM
    bandwidth (the strategy's own ``device_bytes`` among them), the pipeline bubble."""
    m, act, ga = plan.model, mem["activations"], plan.grad_accum
    hbm = float(hw.hbm_gbps) * 1e9
    lay = plan.layout  # the loss' buffers: every chunk's (loss_chunks: the plan's logits are one chunk's)
    loss_mb = act["loss_chunks"]["all_chunks"] / MB if "loss_chunks" in act else act["logits_mb"]
    activations = (act["per_layer_per_microbatch_mb"] * act["layers_on_rank"] + loss_mb) * MB * ga
    tokens = m.global_batch * m.seq_len / plan.world_size
    forward, backward = causal_attention_flops_per_token(m, lay.recompute, lay.recompute_every)
    attention = (forward + backward) * tokens
    size = (local_tokens(plan) * m.d_model / plan.tp * REFERENCE_MATMUL_FLOPS
            / (float(hw.peak_tflops["bf16"]) * 1e12 * peak_ratio(hw)))
    return {
        "flops": executed_flops_per_token(m, lay.recompute, lay.recompute_every, lay.loss_chunks) * tokens
        - attention + traffic.get("extra_flops", 0.0),
        "attention_flops": attention, "attention_peak": _attention_peak(plan, hw, forward, backward),
        "peak": _peak(plan, hw), "peak_ratio": peak_ratio(hw),
        "matmul_size": size, **_float8_split(plan, hw, size),
        "elementwise_s": activations / hbm,
        "optimizer_s": OPTIMIZER_PASSES * sum(mem["model_states"]["device_mb"].values()) * MB / hbm,
        "bubble": (plan.pp - 1) / (plan.layout.virtual_pipeline * ga) if plan.pp > 1 else 0.0,
        "fp8_cast_s": _float8_cast_bytes(plan, act["layers_on_rank"]) / hbm,
        "device_bytes_s": traffic.get("device_bytes", 0.0) / hbm,
    }


def _attention_peak(plan: Plan, hw: HardwareConfig, forward: float, backward: float) -> float:
    """The stated peak's share the causal attention kernels run at on a rank's sequence (s / cp), their forward and
    backward FLOPs each at its own: the run's precision's peak (bf16's under fp8: attention is not converted) x
    share x s / (s + seq_half), from a probe's measurement of this GPU (hardware.attention) or else one H200's
    (bench/machine/hardware.py DEFAULT_ATTENTION)."""
    peak = float(hw.peak_tflops["bf16"]) * 1e12 if plan.run.precision == "fp8" else _peak(plan, hw)
    s = plan.model.seq_len / plan.layout.cp
    a = {**DEFAULT_ATTENTION, **(hw.attention or {})}
    rate = {p: peak * a[f"{p}_share"] * s / (s + a[f"{p}_seq_half"]) for p in ("forward", "backward")}
    return (forward + backward) / (forward / rate["forward"] + backward / rate["backward"])


def _float8_cast_bytes(plan: Plan, layers_on_rank: float) -> float:
    """precision=fp8: bytes of the rank's float8 casts in a step (3 an element; the recomputed matmuls' share again
    under op), split over tp like the matmuls; 0 for other precisions.  Full recompute casts nothing again: fp8 runs
    compiled (validation), and Inductor fuses the recomputed forward's casts into the kernels that recompute their
    inputs (one H200, 8B blocks at 32k: +4.8 ms of Triton kernels where the casts were counted at 82 ms,
    results/2026-12-04-h200x1-long-sequence)."""
    if plan.run.precision != "fp8":
        return 0.0
    m = plan.model
    tokens = local_tokens(plan) * plan.grad_accum
    passes = 1.0
    if plan.layout.recompute == "op":
        passes += describe_model(m).op_recomputed_share()
    return 3.0 * tokens * float8_cast_elements_per_layer_token(m) * layers_on_rank * passes / plan.tp


def _host_terms(plan: Plan, traffic: dict) -> dict[str, float]:
    """Compiled / graphed, the layer passes and micro-batches the host launches, the strategy's host work, and
    whether the host waits on the device every step (sync timing, fp16's overflow check, a strategy's syncs)."""
    run = plan.run
    compiled = bool(run.compile) and not traffic.get("eager", 0)
    graphed = (compiled and run.compile_mode == "reduce-overhead") or traffic.get("graphed", 0) > 0
    syncs = traffic.get("syncs", 0.0) + (1.0 if run.precision == "fp16" else 0.0)
    sync_timing = run.metrics.step_timing == "sync"
    return {"compiled": float(compiled), "graphed": float(graphed), "microbatches": float(plan.grad_accum),
            "layer_passes": plan.model.n_layers / plan.pp * plan.grad_accum,
            "layer_host": traffic.get("layer_host", 1.0), "hooks": traffic.get("hooks", 0.0), "syncs": syncs,
            "host_waits": float(sync_timing or syncs > 0), "host_adam": traffic.get("host_adam", 0.0),
            "host_lockstep": float(plan.world_size > 1 and traffic.get("hooks", 0.0) > 0) * traffic.get("lockstep", 1.0)}


def _exposed(wire, window, share):
    """Overlapped communication's cost: its exposed share while the compute it hides behind lasts, all of it
    beyond that (floats or numpy arrays); with the window it used, (cost, hidden)."""
    hidden = np.minimum(wire, window)
    return wire - hidden + share * hidden, hidden


def compute_parts(t: dict, k: dict) -> dict:
    """The compute's parts in seconds, as the kernels of a profiled step divide it (benchmarks/term_check.py): the
    matmuls, causal attention, the memory-bound elementwise work, the AdamW step, and the rest of the device's bytes
    (fp8's casts, the strategy's own); floats or numpy arrays alike."""
    def e(x):
        return k["e_max"] * x / (x + k["x_half"])

    w8 = t["fp8_time_share"]  # float8 matmuls: their own size on e(x) (_float8_split)
    matmuls = t["flops"] / t["peak"] * ((1 - w8) / e(t["matmul_size"]) + w8 / e(t["matmul_size_fp8"]))
    fused = np.where(t["compiled"] > 0, k["fused"], 1.0)
    return {"matmul": matmuls / t["peak_ratio"],
            "attention": t["attention_flops"] / (t["attention_peak"] * k["e_max"]) / t["peak_ratio"],
            "elementwise": k["passes"] * t["elementwise_s"] * fused, "optimizer": t["optimizer_s"],
            "device_bytes": k["fp8_cast"] * t["fp8_cast_s"] + t["device_bytes_s"]}


def host_time(t: dict, k: dict):
    """H of the module docstring: the host's own work in a step (its Python and launches), seconds."""
    launch = np.where(t["graphed"] > 0, k["graph_host"], np.where(t["compiled"] > 0, k["compiled_host"], 1.0))
    layers = k["per_layer"] * t["layer_passes"] * np.where(t["compiled"] > 0, 1.0, t["layer_host"])
    return t.get("host_factor", 1.0) * (1 + k["lockstep"] * t["host_lockstep"]) * (
        launch * (layers + k["per_microbatch"] * t["microbatches"]) + k["per_step"] + k["per_hook"] * t["hooks"])


def combine(t: dict, k: dict) -> dict:
    """The step and its parts from ``terms`` and the constants; works on floats or numpy arrays alike."""
    compute = sum(compute_parts(t, k).values())
    link = np.where(t.get("link_fitted", 1.0) > 0, k["link_eff"], 1.0) * t.get("link_factor", 1.0)
    # gradient reductions and parameter gathers share one link and one compute window: what the reductions
    # hide behind is not there for the gathers (a slow link's step is at least its overlapped bytes' time)
    grads, hidden = _exposed(t["grad_reduce_s"] / link, BACKWARD_SHARE * compute, k["grad_exposed"])
    params, _ = _exposed(t["param_gather_s"] / link, compute - hidden, k["param_exposed"])
    wire = grads + params + (t["tail_s"] + t["activation_s"] + t["p2p_s"] + t.get("context_s", 0.0)) / link
    comm = wire + COLLECTIVE_LATENCY_S * t["collectives"] + t["offload_s"]
    bubble = (compute + comm) * t["bubble"]
    device = compute + comm + bubble
    host = host_time(t, k)
    overlap = np.where(t["host_waits"] > 0, k["overlap_sync"], k["overlap"])
    step = (np.maximum(device, host) + overlap * np.minimum(device, host) + k["per_sync"] * t["syncs"]
            + k["per_adam_param"] * t["host_adam"])
    return {"step_time_s": step, "compute_s": compute, "exposed_comm_s": comm, "bubble_s": bubble,
            "host_s": step - device}


def load_calibration(path: Optional[Path] = None) -> dict:
    """The shipped calibration (constants and the measured error), or the fit's starting point without one."""
    p = Path(path) if path else CALIBRATION
    if not p.exists():
        return {"constants": dict(DEFAULTS), "error": None}
    return json.loads(p.read_text())


def host_key(hostname: Optional[str], cpu_count: Optional[int]) -> str:
    """A host as the calibration knows it (module docstring): its name and its CPU count."""
    return f"{hostname or '?'}/{cpu_count or '?'} CPUs"


def predict(plan: Plan, hardware: Optional[HardwareConfig] = None, host: Optional[str] = None,
            calibration: Optional[dict] = None) -> dict:
    """Predicted tokens/s and step time of a plan on ``hardware`` (default: the plan's preset or the visible
    GPU) and ``host`` (a ``host_key``; default the median host), the step's breakdown, where its groups live, the
    calibration's measured error overall and on the recorded runs like it, and the bound no run can beat."""
    cal = calibration or load_calibration()
    hw = device_hardware(plan, hardware)
    mismatch = regime_mismatch(plan.run.link_regime, hw)
    if mismatch:
        raise ValueError(f"link_regime={plan.run.link_regime} {mismatch}")
    t = terms(plan, hw)
    t["host_factor"] = (cal.get("host_factors") or {}).get(host, 1.0)
    parts = {name: float(v) for name, v in combine(t, cal["constants"]).items()}
    step = parts.pop("step_time_s")
    tokens = plan.model.global_batch * plan.model.seq_len
    topo = plan_topology(plan, hw)
    case = (gpu_type(hw), topo.nodes, plan.strategy.name)
    return {"tokens_per_s": tokens / step, "step_time_s": step, "breakdown": parts, "error": cal.get("error"),
            "topology": topo.describe(), "placement": topo.as_dict(), "case_error": case_error(cal, *case),
            "regime_error": regime_error(cal, plan, hw), "layout_error": layout_error(cal, plan),
            "bound_tokens_per_s": tokens / bound_step(t)}


def gpu_type(hw: HardwareConfig) -> str:
    """The GPU type a calibration case is filed under: the preset of its device (a probed profile of an H100 is an
    H100), else the hardware's own name."""
    preset = match(hw.gpu)
    return preset.name if preset is not None else hw.name


def bound_step(t: dict) -> float:
    """A floor under the step that needs no calibration: the matmuls at the datasheet peak, or every byte at its
    link's speed, whichever is longer (all else free and perfectly overlapped)."""
    wire = sum(t[f"{k}_s"] for k in BYTE_KINDS)
    return max(t["flops"] / t["peak"], wire)


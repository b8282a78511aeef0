"""Where a step's time goes: an optional torch.profiler pass after the timed window.

``metrics.profile_steps=k`` re-runs the last k steps (same batches) under torch.profiler once
the timed window is closed, so profiling never slows a timed step.  Per rank it reports, per
step: wall time, the time the GPU ran any kernel (the union of kernel intervals, so overlapped
streams are not double-counted), kernel time by kind (matmul, attention, communication,
optimizer, other) and the top kernels.  That answers the usual question behind a slow
strategy: is the step bound by compute, by communication that is not overlapped, or by the
CPU (GPU idle between kernels)?  The top host-side operators by self CPU time are reported too.

Each profiled step runs inside a ``ProfilerStep#<n>`` annotation (``n``: its global step number).
Given a ``trace_path`` (the worker passes ``<run folder>/trace_rank{r}.json.gz``), the rank's
Chrome/Perfetto trace is written there, gzipped, and its compute / communication / overlapped /
idle breakdown per step is added (``trace_file``, ``breakdown_ms_per_step``, ``breakdown_source``;
definitions: bench/metrics/trace.py).  On CUDA, ``memory_at_peak``: what is alive at the profiled steps' allocated
peak and where it was allocated (bench/metrics/memory_history.py).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch

log = logging.getLogger("bench.profile")

# First match wins; names are lower-cased kernel names.  Not "softmax": the attention kernels fuse theirs, and the
# softmax kernels of a step are the loss' (cross entropy's cunn_SoftMaxForward / Backward, Inductor's fused
# log_softmax): 45 ms of gemma-2b's step at one H100 were filed as attention (results/2026-12-06-h100x1-tight-edge)
KINDS = (
    ("communication", ("nccl", "allreduce", "all_reduce", "allgather", "reducescatter", "sendrecv")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "matmul", "wgmma")),
)


def kind_of(kernel: str) -> str:
    k = kernel.lower()
    for kind, keys in KINDS:
        if any(s in k for s in keys):
            return kind
    return "other"


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(events, n_steps: int, wall_s: float, top: int = 10) -> dict:
    """Per-step summary of profiler FunctionEvents (``prof.events()``)."""
    per = 1e-3 / n_steps  # us in all -> ms per step
    # device-side events, without the profiler's GPU user annotations (e.g. "nccl:all_reduce"),
    # which span the kernels they annotate
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
               and not getattr(e, "is_user_annotation", False)]
    out: dict = {"steps": n_steps, "wall_ms_per_step": round(1e3 * wall_s / n_steps, 3)}
    if kernels:
        spans = [(e.time_range.start, e.time_range.end) for e in kernels]
        kinds = [kind_of(e.name) for e in kernels]
        by_kind: dict[str, float] = {}
        by_name: dict[str, float] = {}
        for e, (a, b), kind in zip(kernels, spans, kinds):
            by_kind[kind] = by_kind.get(kind, 0.0) + b - a
            by_name[e.name] = by_name.get(e.name, 0.0) + b - a
        compute = [span for span, kind in zip(spans, kinds) if kind != "communication"]
        first, last = min(a for a, _ in spans), max(b for _, b in spans)
        out.update({
            "gpu_span_ms_per_step": round((last - first) * per, 3),
            "gpu_busy_ms_per_step": round(_union_us(spans) * per, 3),
            "gpu_compute_busy_ms_per_step": round(_union_us(compute) * per, 3),
            "gpu_busy_fraction": round(_union_us(spans) / max(last - first, 1e-9), 4),
            "kernels_per_step": round(len(kernels) / n_steps, 1),
            "kernel_ms_per_step": {k: round(v * per, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top_kernels_ms_per_step": {n[:120]: round(v * per, 3) for n, v in
                                        sorted(by_name.items(), key=lambda kv: -kv[1])[:top]},
        })
    # host side: operators and CUDA runtime calls by self CPU time (a step whose GPU sits idle is
    # bound here: Python / dispatch overhead per op, or synchronizations)
    by_op: dict[str, float] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and not getattr(e, "is_user_annotation", False):
            by_op[e.name] = by_op.get(e.name, 0.0) + e.self_cpu_time_total
    out["cpu_self_ms_per_step"] = round(sum(by_op.values()) * per, 3)
    out["top_cpu_ops_ms_per_step"] = {n[:120]: round(v * per, 3) for n, v in
                                      sorted(by_op.items(), key=lambda kv: -kv[1])[:top]}
    return out


def profile_steps(step: Callable[[int], object], indices: Iterable[int], device: torch.device,
                  trace_path: Optional[Path] = None) -> dict:
    """Run ``step(n)`` for each index under torch.profiler and summarize it; with ``trace_path``,
    also write the trace there (gzipped Chrome trace JSON) and add its time breakdown."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from bench.metrics import memory_history

    indices = list(indices)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    before = memory_history.start(device)  # the allocator's history over the same steps: what is alive at the peak
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for n in indices:
            with record_function(f"ProfilerStep#{n}"):  # the step annotation torch.profiler's schedule writes
                step(n)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall_s = time.perf_counter() - t0
    out = summarize(prof.events(), len(indices), wall_s)
    out["memory_at_peak"] = memory_history.stop(device, before)
    if trace_path is not None:
        out.update(trace_and_breakdown(prof, Path(trace_path), len(indices)))
    return out


def trace_and_breakdown(prof, path: Path, n_steps: int) -> dict:
    """Export the trace (``.gz``: torch gzips it) and read it back for the breakdown; a failure
    here is reported in the record, never fatal to the run."""
    from bench.metrics import trace

    out: dict = {"trace_file": path.name, "breakdown_ms_per_step": None, "breakdown_source": None}
    try:
        prof.export_chrome_trace(str(path))
    except Exception as e:  # noqa: BLE001 - a missing trace must not fail a measured run
        log.warning("trace not written to %s: %s: %s", path, type(e).__name__, e)
        return {**out, "trace_file": None, "trace_error": f"{type(e).__name__}: {e}"}
    try:
        b = trace.breakdown(path, n_steps)
        out.update(breakdown_ms_per_step=b["ms_per_step"], breakdown_source=b["source"])
    except Exception as e:  # noqa: BLE001
        log.warning("no breakdown from %s: %s: %s", path, type(e).__name__, e)
        out["trace_error"] = f"{type(e).__name__}: {e}"
    return out

"""What one device measures alone: the matmul peak per precision, the memory bandwidth of a large copy, and
the host's cost per small op and per module hook.  Every number is the median over repeats of a warmed-up
loop timed between device synchronizations, so a slow first call or one noisy repeat does not set it."""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

from bench.machine.hardware import cpu_name

GIB = 2 ** 30
MIB = 2 ** 20


@dataclass(frozen=True)
class Sizes:
    """How much the probe measures: --quick is for CI and a first look, the default for a profile to keep."""

    matmul_n: int  # square matmul side: large enough to reach the peak on the device
    copy_mib: int  # copied buffer: well above the device's caches
    message_mib: tuple  # collective message sizes (the curve)
    repeats: int
    iters: int
    tiny_ops: int  # calls per timed loop of the host-cost measurements
    attention_seqs: tuple = (2048, 16384)  # causal attention's two sequence lengths (attention_rate)
    attention_tokens: int = 32768  # tokens a call (the batch: tokens / sequence length)

    def record(self) -> dict:
        return asdict(self)


def sizes(device: torch.device, quick: bool) -> Sizes:
    """32 MiB on GPUs: the steps' messages sit between 16 and 64 MiB (DDP's 25 MB buckets, a 300M model's 50 MB
    reductions a block), where the slow links' curves bend (docs/results.md: the 300m runs on slow links)."""
    if device.type == "cuda":
        if quick:
            return Sizes(8192, 512, (1, 16, 32, 64), 3, 5, 500)
        return Sizes(8192, 2048, (1, 4, 16, 32, 64, 256, 1024), 7, 10, 2000)
    if quick:  # CPU in CI: 2 shared cores
        return Sizes(256, 32, (0.0625, 1), 3, 3, 200, (128, 512), 1024)
    return Sizes(1024, 256, (0.0625, 1, 16, 64), 5, 5, 2000, (256, 1024), 4096)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, *, iters: int, repeats: int,
                   warmup: int = 2, best: bool = False) -> float:
    """Seconds per call of ``fn``: the median over ``repeats`` loops of ``iters`` calls, after ``warmup`` calls;
    ``best``: the fastest loop instead (a rate at the clocks a short burst runs at, see matmul_peaks)."""
    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        samples.append((time.perf_counter() - t0) / iters)
    return min(samples) if best else statistics.median(samples)


def _precisions(device: torch.device) -> dict[str, tuple[Optional[torch.dtype], Optional[str]]]:
    """precision -> (dtype, float32 matmul precision); fp8 has its own call.  CPU: fp32 and bf16 (what a CPU
    run can use: fp16 is refused there, tf32 is a tensor-core format)."""
    if device.type != "cuda":
        return {"fp32": (torch.float32, "highest"), "bf16": (torch.bfloat16, None)}
    return {"fp32": (torch.float32, "highest"), "tf32": (torch.float32, "high"), "bf16": (torch.bfloat16, None),
            "fp16": (torch.float16, None), "fp8": (None, None)}


def _fp8_matmul(device: torch.device, n: int) -> tuple[Optional[Callable], str]:
    """A float8 matmul through torch._scaled_mm (what torchao's float8 training calls), or why there is none."""
    if device.type != "cuda":
        return None, "no float8 matmul on CPU"
    cc = torch.cuda.get_device_capability(device)
    if cc < (8, 9) or not hasattr(torch, "_scaled_mm"):
        return None, f"no float8 tensor cores (compute capability {cc[0]}.{cc[1]} < 8.9)"
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    one = torch.ones((), device=device)
    try:  # b.t(): _scaled_mm wants its second operand column-major
        torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError) as e:
        return None, f"torch._scaled_mm failed: {str(e).splitlines()[0][:120]}"
    return (lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)), ""


def matmul_peaks(device: torch.device, s: Sizes) -> tuple[dict, dict]:
    """(TFLOP/s per precision: 2 n^3 / time of an n x n x n matmul, {precision: why not measured}).  The fastest
    loop of ``iters`` matmuls, not the median: the prediction's matmul efficiency is fitted against a short burst's
    rate (bench/launch/worker.py measure_matmul_peak, every recorded run's), and back-to-back loops run at lower
    clocks (one H200: the median 711 TFLOP/s bf16 where runs measured 776-788, results/2026-12-04-h200x1-long-sequence)."""
    peaks, missing, n = {}, {}, s.matmul_n
    before = torch.get_float32_matmul_precision()
    try:
        for prec, (dtype, fp32_mode) in _precisions(device).items():
            if dtype is None:
                fn, why = _fp8_matmul(device, n)
            else:
                if fp32_mode:
                    torch.set_float32_matmul_precision(fp32_mode)
                a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
                fn, why = (lambda a=a, b=b: a @ b), ""
            if fn is None:
                missing[prec] = why
                continue
            t = median_seconds(fn, device, iters=s.iters, repeats=s.repeats, best=True)
            peaks[prec] = 2 * n ** 3 / t / 1e12
    finally:
        torch.set_float32_matmul_precision(before)
    return peaks, missing


def attention_rate(device: torch.device, s: Sizes, peak: Optional[float]) -> dict:
    """Causal attention's kernels as the prediction reads them (bench/machine/hardware.py DEFAULT_ATTENTION): TFLOP/s of
    scaled_dot_product_attention's forward, and of its backward (forward + backward less the forward), on the FLOPs
    a causal kernel runs, at two sequence lengths; each fitted as share x ``peak`` x seq / (seq + seq_half).
    Llama-style heads (32 of 128, grouped 4 to a key/value head, bf16) on a GPU; 4 of 64 in fp32, not grouped, on
    the CPU, as bench's model runs there (a CPU's shares are its own)."""
    heads, kv, dim = (32, 8, 128) if device.type == "cuda" else (4, 4, 64)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rates: dict = {"forward": {}, "backward": {}}
    for seq in s.attention_seqs:
        q = torch.randn(s.attention_tokens // seq, heads, seq, dim, device=device, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(q.shape[0], kv, seq, dim, device=device, dtype=dtype, requires_grad=True) for _ in "kv")
        grad = torch.randn_like(q)

        def forward(q=q, k=k, v=v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != heads)

        fwd = median_seconds(forward, device, iters=s.iters, repeats=s.repeats, best=True)  # as the peak it divides
        both = median_seconds(lambda: forward().backward(grad), device, iters=s.iters, repeats=s.repeats, best=True)
        flops = 2 * heads * dim * seq * s.attention_tokens  # 0.5 x 4 d s a token: QK^T and AV, the causal half
        rates["forward"][seq] = flops / fwd / 1e12
        rates["backward"][seq] = 2 * flops / max(both - fwd, 1e-9) / 1e12
    out = {"tflops": rates}
    for part, r in rates.items():
        (s1, r1), (s2, r2) = sorted(r.items())
        half = max(0.0, (r2 - r1) / (r1 / s1 - r2 / s2)) if r1 / s1 != r2 / s2 else 0.0
        out[f"{part}_share"] = r2 * (s2 + half) / s2 / peak if peak else None
        out[f"{part}_seq_half"] = half
    return out


def copy_gbps(device: torch.device, s: Sizes) -> float:
    """Memory bandwidth (GB/s): bytes read plus bytes written by a copy of a large buffer, per second (the
    STREAM / nvbandwidth convention)."""
    src = torch.empty(s.copy_mib * MIB // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    t = median_seconds(lambda: dst.copy_(src), device, iters=s.iters, repeats=s.repeats)
    return 2 * src.numel() * 4 / t / 1e9


def host_costs(device: torch.device, s: Sizes) -> dict:
    """Host microseconds per small op (a launch-bound loop of x.add_(1) on one element: on a GPU the kernel
    launch) and per forward hook (a one-element Linear called with a no-op pre- and post-hook, minus without)."""
    x = torch.zeros(1, device=device)
    op = median_seconds(lambda: x.add_(1), device, iters=s.tiny_ops, repeats=s.repeats)
    m, inp = torch.nn.Linear(1, 1).to(device), torch.zeros(1, 1, device=device)
    with torch.no_grad():
        bare = median_seconds(lambda: m(inp), device, iters=s.tiny_ops, repeats=s.repeats)
        m.register_forward_pre_hook(lambda mod, args: None)
        m.register_forward_hook(lambda mod, args, out: None)
        hooked = median_seconds(lambda: m(inp), device, iters=s.tiny_ops, repeats=s.repeats)
    return {"op_us": round(op * 1e6, 3), "module_call_us": round(bare * 1e6, 3),
            "hook_us": round(max(hooked - bare, 0.0) / 2 * 1e6, 3),
            "how": "host time per call: x.add_(1) on one element (launch-bound on a GPU); a Linear(1, 1) forward; "
                   "one no-op forward hook (pre + post hooked minus bare, halved)"}


def host_memory_gib() -> Optional[float]:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def device_facts(device: torch.device) -> dict:
    """Name, memory (GiB, as torch reports it: what the presets' memory_gib is) and compute capability."""
    if device.type != "cuda":
        return {"name": cpu_name(), "memory_gib": host_memory_gib(), "compute_capability": None,
                "memory_note": "CPU ranks: device memory is host memory"}
    p = torch.cuda.get_device_properties(device)
    return {"name": p.name, "memory_gib": p.total_memory / GIB, "compute_capability": float(f"{p.major}.{p.minor}")}


def gpu_link(device: torch.device) -> tuple[str, str]:
    """(nvlink | pcie | host, how it was found): NVML's NVLink state of the device's links."""
    if device.type != "cuda":
        return "host", "CPU ranks: gloo through host memory"
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                    return "nvlink", f"NVML: NVLink {link} active"
            except pynvml.NVMLError:
                break
        return "pcie", "NVML: no active NVLink"
    except Exception as e:  # no NVML: say so rather than guess silently
        return "pcie", f"not detected (NVML: {type(e).__name__}): assumed pcie; the measured bandwidth is what counts"

"""Causal attention's own rate on this GPU: scaled_dot_product_attention at bench's shapes, forward and backward.

    python benchmarks/attention_rate.py OUT.json [--heads 32 --kv-heads 8 --head-dim 128 --tokens 32768]

For each sequence length (2k-32k, the batch shrinking so that every row holds ``--tokens`` tokens), each SDPA
backend torch offers here (the default choice, then flash, cuDNN and memory-efficient forced) is timed with CUDA
events over 10 repetitions after 3 warm-up ones: the forward alone and forward + backward.  TFLOP/s are on the
FLOPs a causal kernel runs (half of bench's convention, 4 s d per token forward and 8 backward: model_spec.py), so
they compare with a matmul's rate.  Why: the prediction times attention's FLOPs at the matmuls' efficiency; this
says whether the fused kernel runs at that rate (results/2026-12-04-h200x1-long-sequence).
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def timed(fn, reps: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` on the device."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def one(seq: int, batch: int, heads: int, kv_heads: int, head_dim: int, backend) -> dict:
    kw = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, heads, seq, head_dim, requires_grad=True, **kw)
    k = torch.randn(batch, kv_heads, seq, head_dim, requires_grad=True, **kw)
    v = torch.randn(batch, kv_heads, seq, head_dim, requires_grad=True, **kw)
    grad = torch.randn(batch, heads, seq, head_dim, **kw)
    gqa = kv_heads != heads

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def fwd_bwd():
        fwd().backward(grad)

    ctx = sdpa_kernel([backend]) if backend is not None else torch.enable_grad()
    with ctx:
        fwd_ms, total_ms = timed(fwd), timed(fwd_bwd)
    d = heads * head_dim
    tokens = batch * seq
    fwd_flops = 0.5 * 4 * d * seq * tokens  # QK^T and AV, the causal half
    return {"seq": seq, "batch": batch, "forward_ms": fwd_ms, "forward_backward_ms": total_ms,
            "forward_tflops": fwd_flops / fwd_ms / 1e9, "forward_backward_tflops": 3 * fwd_flops / total_ms / 1e9,
            "backward_tflops": 2 * fwd_flops / (total_ms - fwd_ms) / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32768)
    a = ap.parse_args()
    rows = []
    for name, backend in BACKENDS.items():
        for seq in (2048, 4096, 8192, 16384, 32768):
            try:
                row = one(seq, max(1, a.tokens // seq), a.heads, a.kv_heads, a.head_dim, backend)
            except RuntimeError as e:  # a backend that refuses these shapes
                row = {"seq": seq, "error": str(e).splitlines()[0][:200]}
            row["backend"] = name
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "heads": a.heads,
                   "kv_heads": a.kv_heads, "head_dim": a.head_dim, "tokens": a.tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

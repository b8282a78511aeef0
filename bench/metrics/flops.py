"""Model FLOPs per token and MFU.

flops/token = 6N + 12 * L * d * seq  (forward + backward; PaLM appendix B)
  N   = parameters that take part in matrix multiplies: the L transformer blocks
        (attention q/k/v/o, MLP, their biases and LayerNorms), the final LayerNorm and
        the output projection; token and position embeddings (lookups) are excluded.
  12*L*d*seq = attention scores and weighted sum (QK^T, AV), forward + backward,
        counted without the causal-mask saving, as is conventional.
MFU = achieved model TFLOP/s per device / dense peak TFLOP/s of the device at the
run's precision (table below, datasheet numbers without sparsity; overridable with
metrics.peak_tflops).
"""
from __future__ import annotations

from typing import Optional

FORMULA = "flops_per_token = 6*N + 12*L*d*seq"
N_COUNTS = ("parameters of the L transformer blocks (q/k/v/o, MLP, biases, LayerNorms), the final "
            "LayerNorm and the output projection; embeddings excluded")

# Dense (no sparsity) peak TFLOP/s by device-name substring: (bf16/fp16 tensor, tf32 tensor, fp32).
# Sources: vendor datasheets. First match wins, so more specific names come first.
PEAK_TFLOPS: list[tuple[str, tuple[float, float, float]]] = [
    ("H100 PCIe", (756.0, 378.0, 51.2)),
    ("H100 NVL", (835.0, 417.5, 60.0)),
    ("H100", (989.4, 494.7, 66.9)),   # SXM
    ("H200", (989.4, 494.7, 66.9)),   # SXM
    ("H20", (148.0, 74.0, 44.0)),
    ("GH200", (989.4, 494.7, 66.9)),
    ("B200", (2250.0, 1100.0, 80.0)),
    ("A100", (312.0, 156.0, 19.5)),
    ("A800", (312.0, 156.0, 19.5)),
    ("L40S", (362.1, 183.0, 91.6)),
    ("L4", (121.0, 60.0, 30.3)),
    ("RTX A6000", (154.8, 77.4, 38.7)),
    ("RTX 6000 Ada", (364.2, 182.1, 91.1)),
    ("RTX 4090", (165.2, 82.6, 82.6)),
    ("RTX 3090", (71.0, 35.6, 35.6)),
    ("V100", (125.0, 15.7, 15.7)),
]


def matmul_params(model: dict) -> int:
    d, ff, L, V = model["d_model"], model["d_ff"], model["n_layers"], model["vocab_size"]
    attn = 4 * d * d + 4 * d
    mlp = 2 * d * ff + ff + d
    norms = 4 * d
    return L * (attn + mlp + norms) + 2 * d + d * V


def total_params(model: dict) -> int:
    d, V, seq = model["d_model"], model["vocab_size"], model["seq_len"]
    return matmul_params(model) + V * d + seq * d


def flops_per_token(model: dict) -> int:
    return 6 * matmul_params(model) + 12 * model["n_layers"] * model["d_model"] * model["seq_len"]


def peak_tflops(device_name: Optional[str], precision: str, tf32: bool) -> tuple[Optional[float], str]:
    """(peak, source) for a device name and precision; (None, reason) when unknown."""
    if not device_name:
        return None, "no GPU: no peak known (set metrics.peak_tflops)"
    col = 0 if precision in ("bf16", "fp16") else (1 if tf32 else 2)
    kind = ("bf16/fp16 dense tensor", "tf32 dense tensor", "fp32")[col]
    for key, peaks in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return peaks[col], f"datasheet {key} {kind}"
    return None, f"device {device_name!r} not in the peak table (set metrics.peak_tflops)"

"""Model FLOPs per token and MFU.

flops/token = 6N + 12 * L * d * seq  (forward + backward; PaLM appendix B)
  N   = parameters that take part in matrix multiplies: the L transformer blocks
        (gpt: attention q/k/v/o, MLP, their biases and LayerNorms; llama: q/o d x d, k/v
        d x n_kv_heads*head_dim, SwiGLU gate/up/down, RMSNorms, q/k/v biases with qkv_bias), the final norm and
        the output projection d x V (counted even when tied to the token embedding: it is a
        matmul); token and position embeddings (lookups) are excluded.
  12*L*d*seq = attention scores and weighted sum (QK^T, AV), forward + backward,
        counted without the causal-mask saving, as is conventional (d = n_heads * head_dim =
        d_model; the same with grouped-query attention).
total parameters = the model's unique parameters: N + token embedding (+ learned position
embedding for gpt) - the output projection when tied.
MFU = achieved model TFLOP/s per device / dense peak TFLOP/s of the device at the
run's precision (table below, datasheet numbers without sparsity; overridable with
metrics.peak_tflops); precision=fp8 against the bf16 peak (MFU_PRECISION): only the blocks'
matmuls run in float8, and against bf16's peak an fp8 run's MFU is comparable with a bf16 run's
(its gain shows as a higher MFU); the fp8 peak is recorded beside it (flops.peak_tflops_fp8).  HFU (hardware FLOPs utilization) counts what the device executes,
including the forward that activation recomputation runs again (HFU_FORMULA); MFU does not,
so recomputation lowers MFU and leaves HFU near the same.
"""
from __future__ import annotations

from typing import Optional

from bench.hardware import peak_table

FORMULA = "flops_per_token = 6*N + 12*L*d*seq"
N_COUNTS = ("parameters of the L transformer blocks (q/k/v/o, MLP, biases, norms), the final norm and "
            "the output projection (also when tied to the token embedding: it is a matmul); embeddings excluded")

def param_groups(model: dict) -> dict[str, int]:
    """Parameters by part: embedding (token + learned positions), one block, the final norm, the
    output projection (d x V, also when tied), and whether it is tied."""
    d, ff, V = model["d_model"], model["d_ff"], model["vocab_size"]
    if model.get("arch", "gpt") == "llama":
        kv = (model.get("n_kv_heads") or model["n_heads"]) * (d // model["n_heads"])
        block = 2 * d * d + 2 * d * kv + 3 * d * ff + 2 * d  # q, o; k, v; gate, up, down; two RMSNorms
        block += (d + 2 * kv) if model.get("qkv_bias") else 0  # Qwen2's q/k/v biases
        emb, norm = V * d, d
    else:
        block = (4 * d * d + 4 * d) + (2 * d * ff + ff + d) + 4 * d  # attention, MLP, two LayerNorms
        emb, norm = V * d + model["seq_len"] * d, 2 * d
    return {"embedding": emb, "block": block, "norm": norm, "head": d * V,
            "tied": bool(model.get("tie_embeddings", False))}


def matmul_params(model: dict) -> int:
    g = param_groups(model)
    return model["n_layers"] * g["block"] + g["norm"] + g["head"]


def total_params(model: dict) -> int:
    """Unique parameters of bench.model.build_model(model): a tied output projection once."""
    g = param_groups(model)
    return g["embedding"] + model["n_layers"] * g["block"] + g["norm"] + (0 if g["tied"] else g["head"])


def flops_per_token(model: dict) -> int:
    return 6 * matmul_params(model) + 12 * model["n_layers"] * model["d_model"] * model["seq_len"]


HFU_FORMULA = ("hardware_flops_per_token = flops_per_token + recomputed forward: full: 2*L*N_block + 4*L*d*seq; "
               "selective: 4*L*d*seq (the attention core); none: 0")


def hardware_flops_per_token(model: dict, recompute: str) -> int:
    """FLOPs the device executes per token, recomputed forward included (HFU's numerator; MFU's excludes it)."""
    L, attn_fwd = model["n_layers"], 4 * model["n_layers"] * model["d_model"] * model["seq_len"]
    extra = {"none": 0, "selective": attn_fwd, "full": 2 * L * param_groups(model)["block"] + attn_fwd}[recompute]
    return flops_per_token(model) + extra


def float8_matmul_params(model: dict) -> int:
    """The blocks' Linear weights (attention q/k/v/o, the MLP): what precision=fp8 converts to float8 matmuls
    (bench/parallel/float8.py; the head stays bf16; layers it leaves in bf16 for their shapes are not subtracted)."""
    d, ff = model["d_model"], model["d_ff"]
    kv = (model.get("n_kv_heads") or model["n_heads"]) * (d // model["n_heads"])
    mlp = 3 * d * ff if model.get("arch", "gpt") == "llama" else 2 * d * ff
    return model["n_layers"] * (2 * d * d + 2 * d * kv + mlp)


def float8_cast_elements_per_layer_token(model: dict) -> int:
    """Elements precision=fp8 casts to float8 per token in one block's converted Linear layers: each layer's input
    (forward) and its output gradient (backward), as torchao casts them before each float8 matmul.
    Memory-bound work on top of the matmuls (bench/predict.py, ``fp8_cast``)."""
    d, ff = model["d_model"], model["d_ff"]
    kv = (model.get("n_kv_heads") or model["n_heads"]) * (d // model["n_heads"])
    up = 2 if model.get("arch", "gpt") == "llama" else 1  # llama: gate and up; gpt: one fc
    inputs = 4 * d + up * d + ff            # q, k, v, o; the MLP's up projection(s); its down projection
    output_grads = 2 * d + 2 * kv + up * ff + d
    return inputs + output_grads


# the peak MFU divides by, per run precision: an fp8 run against bf16's (module docstring)
MFU_PRECISION = {"fp8": "bf16"}


def mfu_peak_tflops(device_name: Optional[str], precision: str, tf32: bool) -> tuple[Optional[float], str]:
    """MFU's denominator: ``peak_tflops`` at MFU_PRECISION's precision (fp8 runs: the bf16 peak)."""
    key = MFU_PRECISION.get(precision, precision)
    peak, source = peak_tflops(device_name, key, tf32)
    return peak, source + (f" (a {precision} run: MFU against the {key} peak, comparable with {key} runs)"
                           if key != precision else "")


def peak_tflops(device_name: Optional[str], precision: str, tf32: bool) -> tuple[Optional[float], str]:
    """(peak, source) for a device name and precision from the hardware table (bench/hardware.py: the
    presets, then further datasheet rows); (None, reason) when unknown."""
    if not device_name:
        return None, "no GPU: no peak known (set metrics.peak_tflops)"
    key = precision if precision in ("bf16", "fp16", "fp8") else ("tf32" if tf32 else "fp32")
    kind = {"bf16": "bf16/fp16 dense tensor", "fp16": "bf16/fp16 dense tensor", "fp8": "fp8 dense tensor",
            "tf32": "tf32 dense tensor", "fp32": "fp32"}[key]
    peaks, source = peak_table(device_name)
    if peaks is None:
        return None, source
    peak = peaks.get(key) if key != "fp16" else peaks.get("fp16", peaks.get("bf16"))
    if peak is None:
        return None, f"{source}: no {kind} peak"
    return peak, f"{source} {kind}"

"""Model FLOPs per token and MFU.

What a model counts (parameters by part, FLOPs per token: 6N + 12 L d seq, the float8-converted weights) is its
description's (bench/models/model_spec.py, where the formula is explained); the functions here take a model config and
ask it, for the callers that hold a config.

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

from bench.machine.hardware import peak_table
from bench.models.model_spec import describe_model
from bench.spec.schema import ModelConfig

FORMULA = "flops_per_token = 6*N + 12*L*d*seq"
N_COUNTS = ("parameters of the L transformer blocks (q/k/v/o, MLP, biases, norms), the final norm and "
            "the output projection (also when tied to the token embedding: it is a matmul); embeddings excluded")


def param_groups(model: ModelConfig) -> dict[str, int]:
    return describe_model(model).param_groups()


def matmul_params(model: ModelConfig) -> int:
    return describe_model(model).matmul_params()


def total_params(model: ModelConfig) -> int:
    """Unique parameters of bench.models.model.build_model(model): a tied output projection once."""
    return describe_model(model).total_params()


def flops_per_token(model: ModelConfig) -> int:
    return describe_model(model).flops_per_token()


HFU_FORMULA = ("hardware_flops_per_token = flops_per_token + recomputed forward: full: 2*L*N_block + 4*L*d*seq; "
               "selective: 4*L*d*seq (the attention core); op: 2*L*(the block's even matmuls but its last: "
               "k and o_proj, and the MLP's up projection where it has one); none: 0; + 2*d*vocab with loss_chunks > 1 "
               "(the head's matmul again in backward)")


def hardware_flops_per_token(model: ModelConfig, recompute: str, every: int = 1, loss_chunks: int = 1) -> int:
    """FLOPs the device executes per token, recomputed forward included (HFU's numerator; MFU's excludes it);
    ``every``: recompute_every (every k-th block checkpointed); ``loss_chunks`` > 1: the head's checkpointed
    matmul runs again in backward."""
    from bench.spec.layout import checkpointed_blocks

    share = checkpointed_blocks(recompute, every, model.n_layers) / model.n_layers if recompute == "full" else 1.0
    spec = describe_model(model)
    return spec.hardware_flops_per_token(recompute, share) + (spec.head_forward_flops() if loss_chunks > 1 else 0)


def executed_flops_per_token(model: ModelConfig, recompute: str, every: int = 1, loss_chunks: int = 1) -> int:
    """FLOPs the device actually runs per token: the hardware FLOPs less what the causal attention kernel skips
    (bench/models/model_spec.py ``causal_skipped_flops_per_token``) and, under full recompute, the blocks' last
    matmul that torch's checkpoint does not run again (``checkpoint_skipped_flops_per_token``; a strategy whose
    recompute reruns it adds it back: megatron-core's, ``extra_flops``): what the prediction times, not what MFU
    counts."""
    share, spec = _checkpointed_share(model, recompute, every), describe_model(model)
    skipped = spec.checkpoint_skipped_flops_per_token(share) if recompute == "full" else 0
    return hardware_flops_per_token(model, recompute, every, loss_chunks) - skipped \
        - spec.causal_skipped_flops_per_token(recompute, share)


def causal_attention_flops_per_token(model: ModelConfig, recompute: str, every: int = 1) -> tuple[int, int]:
    """Of executed_flops_per_token, the causal attention kernels' (scores and weighted sum): (forward passes,
    backward)."""
    return describe_model(model).causal_attention_flops_per_token(recompute,
                                                                  _checkpointed_share(model, recompute, every))


def _checkpointed_share(model: ModelConfig, recompute: str, every: int) -> float:
    from bench.spec.layout import checkpointed_blocks

    return checkpointed_blocks(recompute, every, model.n_layers) / model.n_layers if recompute == "full" else 1.0


def float8_matmul_params(model: ModelConfig) -> int:
    return describe_model(model).float8_matmul_params()


def float8_cast_elements_per_layer_token(model: ModelConfig) -> int:
    """Memory-bound work on top of fp8's matmuls (bench/plan/predict.py, ``fp8_cast``)."""
    return describe_model(model).float8_cast_elements_per_layer_token()


# the peak MFU divides by, per run precision: an fp8 run against bf16's (module docstring)
MFU_PRECISION = {"fp8": "bf16"}


def mfu_peak_tflops(device_name: Optional[str], precision: str, tf32: bool) -> tuple[Optional[float], str]:
    """MFU's denominator: ``peak_tflops`` at MFU_PRECISION's precision (fp8 runs: the bf16 peak)."""
    key = MFU_PRECISION.get(precision, precision)
    peak, source = peak_tflops(device_name, key, tf32)
    return peak, source + (f" (a {precision} run: MFU against the {key} peak, comparable with {key} runs)"
                           if key != precision else "")


def peak_tflops(device_name: Optional[str], precision: str, tf32: bool) -> tuple[Optional[float], str]:
    """(peak, source) for a device name and precision from the hardware table (bench/machine/hardware.py: the
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

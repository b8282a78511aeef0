"""precision=fp8: torchao's float8 training, one step of the torch-native composition (parallelize.py).

``convert_to_float8_training`` swaps nn.Linear layers for torchao's Float8Linear: their three matmuls
(forward, input gradient, weight gradient) run on float8 tensor cores with dynamic scales (the recipe:
``fp8_recipe``), while the weights stay fp32 master weights under an unchanged optimizer, and everything
else runs in bf16 (autocast, or FSDP2's MixedPrecisionPolicy).  It runs before tensor parallelism, as in
torchtitan, so TP can shard the Float8Linear layers with torchao's float8 styles (bench/parallel/tp.py).

Left in bf16, with the reason recorded: the output projection (the LM head: the logits' precision matters
most, and torchtitan leaves it out too) and any Linear whose in / out features (per tensor-parallel shard)
are not multiples of 16, which float8 matmuls (torch._scaled_mm) need.  Under FSDP2 with tensorwise scaling
the converted weights are all-gathered in float8 (``strategy.fp8_all_gather``) and their scales computed
for all of them in one all-reduce after each optimizer step (``strategy.fp8_precompute_scale``).

torchao is imported only by a run that converts: validation, the memory plan and the analysis stay light.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

from bench.spec.schema import BenchConfig

if TYPE_CHECKING:  # annotations only: the rules here are read by validation and the plan, which never import torch
    import torch.nn as nn

HEAD = "head"  # bench.models.model.GPT's output projection
ALIGN = 16  # torch._scaled_mm: both matmul dimensions a multiple of 16


def converts(run: BenchConfig) -> bool:
    return run.precision == "fp8"


def fsdp_float8_all_gather(plan) -> bool:
    """FSDP2 gathers the converted weights in float8: precision=fp8 with tensorwise scaling (the only recipe
    torchao's float8 all-gather supports) and a strategy whose ``fp8_all_gather`` is on."""
    return (converts(plan.run) and plan.run.fp8_recipe == "tensorwise"
            and bool(getattr(plan.strategy, "fp8_all_gather", False)))


# torchao's Float8Linear saves its bf16 input for backward (matmul_with_hp_or_float8_args) and casts it to float8
# again for the weight gradient's matmul; compiled (precision=fp8 is compiled only), Inductor's partitioner keeps that
# float8 cast instead (1 B per element, the smaller of the two): tensorwise's is the forward's own cast, rowwise's
# the dim-0 one.  rowwise_with_gw_hp computes the weight gradient from the bf16 input
# (cast_config_input_for_grad_weight: ScalingType.DISABLED), so its saved input stays bf16.
FLOAT8_SAVED_INPUT_RECIPES = ("tensorwise", "rowwise")


def saves_float8_inputs(run: BenchConfig) -> bool:
    """The converted Linear layers' inputs are saved for backward in float8, 1 B per element (see above)."""
    return converts(run) and bool(run.compile) and run.fp8_recipe in FLOAT8_SAVED_INPUT_RECIPES


def precomputes_scales(plan) -> bool:
    """One all-reduce for every float8 weight's scale after the optimizer step (with the float8 all-gather)."""
    return fsdp_float8_all_gather(plan) and bool(getattr(plan.strategy, "fp8_precompute_scale", False))


def float8_tp(plan) -> bool:
    """Tensor parallelism shards the Float8Linear layers with torchao's float8 styles (tensorwise only)."""
    return converts(plan.run) and plan.run.fp8_recipe == "tensorwise"


def bf16_reason(module: nn.Linear, fqn: str, tp: int = 1) -> Optional[str]:
    """Why this Linear stays in bf16, or None: it is converted."""
    if fqn.rsplit(".", 1)[-1] == HEAD:
        return "output projection (LM head): kept in bf16, as torchtitan does"
    align = ALIGN * (tp if fqn.startswith("blocks.") else 1)  # each tensor-parallel shard's matmul
    if module.in_features % align or module.out_features % align:
        return (f"in x out features {module.in_features} x {module.out_features} not multiples of {align} "
                f"(float8 matmuls need multiples of {ALIGN}{' per tensor-parallel shard' if align != ALIGN else ''})")
    return None


def apply_float8(model: nn.Module, plan) -> dict:
    """Convert ``model``'s Linear layers to torchao Float8Linear (module docstring); what was converted and
    what was left in bf16, for metrics.json's layout."""
    import torchao
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    recipe = plan.run.fp8_recipe
    config = Float8LinearConfig.from_recipe_name(recipe)
    gather = fsdp_float8_all_gather(plan)
    if gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    if plan.device == "cpu":  # torchao's emulation: the float8 values' product by torch.mm in fp32 (exact products,
        # fp32 sums as the GPU's); the CPU's own torch._scaled_mm is a reference kernel 100x slower
        config = dataclasses.replace(config, emulate=True)
    left: dict[str, str] = {}

    def convert(module: nn.Module, fqn: str) -> bool:
        reason = bf16_reason(module, fqn, plan.tp)
        if reason is not None:
            left[fqn] = reason
        return reason is None

    convert_to_float8_training(model, module_filter_fn=convert, config=config)
    converted = [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    return {"float8": {
        "library": f"torchao {torchao.__version__} convert_to_float8_training", "recipe": recipe,
        "converted_count": len(converted), "converted": converted, "left_in_bf16": left,
        "gemm": "emulated (torch.mm in fp32)" if config.emulate else "torch._scaled_mm",
        "fsdp_float8_all_gather": gather, "precompute_scale": precomputes_scales(plan),
        "rest": "bf16 (autocast or FSDP2 MixedPrecisionPolicy), fp32 master weights and optimizer states"}}


def precompute_scales(chunks: list[nn.Module]) -> None:
    """After an optimizer step: every float8-gathered weight's scale in one all-reduce (torchao)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    for chunk in chunks:
        precompute_float8_dynamic_scale_for_fsdp(chunk)

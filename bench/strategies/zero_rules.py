"""ZeRO's rules that need more than a line (bench/strategies/zero.py ``rules`` calls them): where DeepSpeed would
raise inside deepspeed.initialize, fall back silently, or run something other than the knob says."""
from __future__ import annotations

from bench.spec.schema import ConfigError, Plan


def rules_reduce_dtype(plan: Plan) -> None:
    """strategy.reduce_dtype=param in fp32: there is no 16-bit dtype to sum in."""
    s, c = plan.strategy, plan.run
    if s.reduce_dtype == "param" and c.precision == "fp32":
        raise ConfigError("strategy.reduce_dtype", "param", "takes effect only with precision=bf16 or fp16 (with "
                          "precision=fp32 the parameters are fp32); use strategy.reduce_dtype=auto or precision=bf16")


def rules_no_grad_norm(plan: Plan) -> None:
    """DeepSpeed 0.19.8 accepts zero_optimization.compute_grad_norm=false only where nothing needs the norm;
    it would raise these inside deepspeed.initialize on every rank."""
    s, c = plan.strategy, plan.run
    stage = s.zero_stage
    if stage not in (1, 2):
        raise ConfigError("strategy.compute_grad_norm", False, f"only ZeRO stages 1-2 can skip the gradient norm "
                          f"(strategy.zero_stage={stage} here); use zero_stage=1 or 2, or compute_grad_norm=true")
    if c.optim.grad_clip > 0:
        raise ConfigError("strategy.compute_grad_norm", False, f"clipping needs the gradient norm "
                          f"(optim.grad_clip={c.optim.grad_clip}); set optim.grad_clip=0 or compute_grad_norm=true")
    if s.offload_optimizer != "none":
        raise ConfigError("strategy.compute_grad_norm", False, "DeepSpeed's optimizer offload always computes the "
                          "norm; use offload_optimizer=none or compute_grad_norm=true")
    accum = ((s.ds_config or {}).get("data_types") or {}).get("grad_accum_dtype")
    if stage == 1 and c.precision == "bf16" and not s.autocast and accum == "fp32":
        raise ConfigError("strategy.compute_grad_norm", False, "ZeRO-1 in DeepSpeed's own bf16 with "
                          "strategy.ds_config.data_types.grad_accum_dtype=fp32 runs its BF16_Optimizer, which always "
                          "computes the norm; drop that grad_accum_dtype, use zero_stage=2, or compute_grad_norm=true")


def rules_deepcompile(plan: Plan) -> None:
    """DeepCompile is a torch.compile backend that DeepSpeed installs in engine.compile (ZeRO-1/2/3
    passes, a CUDA op); DeepSpeed would silently fall back to plain torch.compile otherwise."""
    s, c = plan.strategy, plan.run
    if not c.compile:
        raise ConfigError("strategy.deepcompile", True, "DeepCompile runs through engine.compile; set compile=true "
                          "(or strategy.deepcompile=false)")
    if s.zero_stage == 0:
        raise ConfigError("strategy.deepcompile", True, "DeepCompile has passes for ZeRO stages 1-3 only "
                          "(DeepSpeed falls back to plain torch.compile at stage 0); use strategy.zero_stage=1, 2 or 3")
    if plan.device != "cuda":
        raise ConfigError("strategy.deepcompile", True, f"DeepCompile runs on CUDA only (this run's device is "
                          f"{plan.device}); set strategy.deepcompile=false")
    if s.leaf_blocks:
        raise ConfigError("strategy.leaf_blocks", True, "DeepCompile gathers ZeRO-3 parameters in its graph and fails "
                          "on leaf modules (DeepSpeed 0.19.8); use leaf_blocks=false with deepcompile, or deepcompile=false")
    if c.compile_mode != "default":
        raise ConfigError("compile_mode", c.compile_mode, "DeepCompile compiles with its own Inductor backend, "
                          "which takes no mode; use compile_mode=default with strategy.deepcompile=true")

"""ZeRO's rules that need more than a line (bench/strategies/zero.py ``rules`` calls them): where DeepSpeed would
raise inside deepspeed.initialize, fall back silently, or run something other than the knob says; and what the rules,
the memory and traffic terms and the engine (bench/strategies/zero_engine.py) all read: which Adam runs, whether
torch_autocast does, what share of the gradients is reduced in 16 bit.  No torch here: validation reads it."""
from __future__ import annotations

from bench.models.model_spec import describe_model
from bench.spec.schema import BenchConfig, ConfigError, Plan

REDUCE_DTYPES = ("auto", "fp32", "param")  # strategy.reduce_dtype


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


def fused_fp16_wrapper(plan: Plan) -> bool:
    """DeepSpeed's own fp16 at stage 0 on CUDA: its FP16_Optimizer (flat fp32 master, the loss-scale knobs) wraps
    FusedAdam only; any other optimizer gets FP16_UnfusedOptimizer (engine._configure_fp16_optimizer)."""
    return (plan.strategy.zero_stage == 0 and plan.run.precision == "fp16" and plan.device == "cuda"
            and not runs_torch_autocast(plan.run))


UNFUSED_FP16_SCALE_POWER = 16  # DeepSpeed's FP16_UnfusedOptimizer starts its loss scale at 2**16 (loss_scaler.py)


def check_adam(plan: Plan) -> None:
    """strategy.adam where it cannot apply (bench/strategies/zero.py rules): the record would name another Adam."""
    s = plan.strategy
    if s.adam != "auto" and s.offload_optimizer != "none":  # the engine steps offloaded states with its CPU Adam only
        raise ConfigError("strategy.adam", s.adam, "optimizer offload steps on the host with DeepSpeedCPUAdam, whichever "
                          f"Adam is named (strategy.offload_optimizer={s.offload_optimizer}); use strategy.adam=auto "
                          "or strategy.offload_optimizer=none")
    if s.adam == "deepspeed" and plan.device != "cuda":
        raise ConfigError("strategy.adam", s.adam, f"FusedAdam is a CUDA op (this run's device is {plan.device}); use "
                          "strategy.adam=auto or torch")
    if s.adam == "torch" and fused_fp16_wrapper(plan) and s.fp16.initial_scale_power != UNFUSED_FP16_SCALE_POWER:
        raise ConfigError("strategy.adam", s.adam, "DeepSpeed's own fp16 at stage 0 wraps a torch optimizer in its "
                          "unfused fp16 optimizer, which starts the loss scale at 2**16 whatever "
                          f"strategy.fp16.initial_scale_power (={s.fp16.initial_scale_power}) says; use strategy.adam=auto")


def adam_of(plan: Plan) -> str:
    """The Adam that runs without optimizer offload: strategy.adam, auto resolved to torch's AdamW (fused on CUDA:
    the speed and losses of DeepSpeed's FusedAdam with nothing to JIT-build, results/2026-12-06-h200x1-adam-and-host)
    except where DeepSpeed's fused fp16 wrapper takes FusedAdam only."""
    if plan.strategy.adam != "auto":
        return plan.strategy.adam
    return "deepspeed" if fused_fp16_wrapper(plan) else "torch"


def runs_torch_autocast(run: BenchConfig) -> bool:
    """DeepSpeed's torch_autocast: strategy.autocast, or a raw ds_config that enables it."""
    raw = ((run.strategy.ds_config or {}).get("torch_autocast") or {}).get("enabled")
    return run.precision != "fp32" and bool(run.strategy.autocast or raw)


def half_reduced_share(plan: Plan) -> float:
    """Share of the gradient elements DeepSpeed reduces in 16 bit, the rest in fp32 (as its comms logger counts
    them, tests/test_sharding.py): under its own bf16 / fp16 all (communication_data_type: the parameters' dtype); in
    fp32 none; under torch_autocast at stage 0 none (the engine's communication_data_type is fp32), at stages 1-3
    those of the blocks' nn.Linear layers (torch_autocast.py gives them the autocast dtype as comm_dtype; bench's
    Head, a subclass, does not match); strategy.reduce_dtype=fp32 none, param all (PARAM_MODULES)."""
    s, run = plan.strategy, plan.run
    if run.precision == "fp32" or s.reduce_dtype == "fp32":
        return 0.0
    if not runs_torch_autocast(run) or s.reduce_dtype == "param":
        return 1.0
    if not s.zero_stage:
        return 0.0
    desc = describe_model(plan.model)
    return desc.layers * desc.block_linear_params() / desc.total_params()

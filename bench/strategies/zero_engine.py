"""DeepSpeed's engine for ``strategy=zero``: the DeepSpeed config generated from a Plan and the Strategy that
runs it (bench/strategies/zero.py has the schema, rules and memory / traffic terms; its docstring says how a
step and precision run)."""
from __future__ import annotations

import copy
from typing import Any, Optional

import torch
from omegaconf import OmegaConf

from bench.models.model import Block, Head, build_model, model_loss
from bench.parallel.ac import apply_ac, apply_loss_chunks
from bench.parallel.compile import compile_kwargs
from bench.parallel.optim import adamw
from bench.strategies.base import StepResult, Strategy
from bench.strategies.deepspeed_env import ensure_torch_extensions_dir, fix_cuda_arch_list
from bench.strategies.zero_rules import adam_of

AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # DeepSpeed's torch_autocast.dtype names
# the module classes of bench's model that hold parameters: each one's gradients summed in 16 bit under torch_autocast
# with reduce_dtype=param (DeepSpeed matches the class exactly: Head is not an nn.Linear to it)
PARAM_MODULES = (torch.nn.Linear, Head, torch.nn.Embedding, torch.nn.LayerNorm, torch.nn.RMSNorm)


def build_ds_config(plan) -> dict:
    """The DeepSpeed config of a Plan: batch layout, precision, ZeRO knobs, then ds_config."""
    c, s = plan.run, plan.strategy
    stage = s.zero_stage
    pin = plan.device == "cuda"  # pinned host buffers need CUDA
    zo: dict[str, Any] = {
        "stage": stage,
        "contiguous_gradients": s.contiguous_gradients,
        # null -> DeepSpeed's own default, written out so the record says what ran
        "overlap_comm": stage == 3 if s.overlap_comm is None else s.overlap_comm,
        "reduce_bucket_size": int(s.reduce_bucket_size),
        "allgather_bucket_size": int(s.allgather_bucket_size),
        "compute_grad_norm": s.compute_grad_norm,
    }
    if stage == 3:
        zo.update(stage3_prefetch_bucket_size=int(s.prefetch_bucket_size),
                  stage3_param_persistence_threshold=int(s.param_persistence_threshold),
                  stage3_max_live_parameters=int(s.max_live_parameters))
        if s.leaf_blocks:  # DeepSpeed matches the class by its qualified name
            zo["leaf_module"] = {"classes": [f"{Block.__module__}.{Block.__qualname__}"]}
    if s.offload_optimizer != "none":
        zo["offload_optimizer"] = {"device": s.offload_optimizer, "pin_memory": pin}
    if s.offload_param != "none":
        zo["offload_param"] = {"device": s.offload_param, "pin_memory": pin}
    cfg: dict[str, Any] = {
        "train_batch_size": plan.model.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": float(c.optim.grad_clip),
        "steps_per_print": 2**31 - 1,  # bench logs progress itself
        "wall_clock_breakdown": False,
        "zero_optimization": zo,
    }
    if s.deepcompile:
        cfg["compile"] = {"deepcompile": True}
    if s.autocast and c.precision in AUTOCAST_DTYPES:
        cfg["torch_autocast"] = {"enabled": True, "dtype": AUTOCAST_DTYPES[c.precision]}
    elif c.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif c.precision == "fp16":
        f = s.fp16
        cfg["fp16"] = {"enabled": True, "loss_scale": f.loss_scale,
                       "initial_scale_power": f.initial_scale_power,
                       "loss_scale_window": f.loss_scale_window, "hysteresis": f.hysteresis,
                       "consecutive_hysteresis": f.consecutive_hysteresis,
                       "min_loss_scale": f.min_loss_scale}
    if s.reduce_dtype != "auto" and c.precision != "fp32":
        if "torch_autocast" in cfg and stage:  # stages 1-3 reduce each parameter in its comm_dtype, the autocast
            # dtype for the modules named: none (fp32), or every class of bench's model that holds parameters
            cfg["torch_autocast"]["lower_precision_safe_modules"] = [] if s.reduce_dtype == "fp32" else [
                f"{m.__module__}.{m.__qualname__}" for m in PARAM_MODULES]
        else:  # the engine's (stage 0), and stages 1-3's without torch_autocast
            cfg["communication_data_type"] = "fp32" if s.reduce_dtype == "fp32" else c.precision
    # strategy.ds_config (a raw dict) merged last: dicts merge, anything else replaces
    return OmegaConf.to_container(OmegaConf.merge(cfg, s.ds_config or {}))


def comms_calls() -> Optional[dict]:
    """DeepSpeed's own count of its collectives since the engine started, warm-up included: {op: {message bytes:
    calls}} from its comms logger (on with +strategy.ds_config.comms_logger.enabled=true and .prof_all=true; each
    logged op then synchronises, so it is a diagnostic, not a timing), None with the logger off."""
    from deepspeed.comm.comm import comms_logger

    if not comms_logger.enabled:
        return None
    return {op: {str(size): v[0] for size, v in sizes.items()} for op, sizes in comms_logger.get_raw_data().items()}


PRECISION_NOTES = {  # (precision, autocast) -> what ran
    ("fp32", False): "fp32",
    ("bf16", False): "DeepSpeed bf16: bf16 params/grads/compute, fp32 master weights + Adam states "
                     "in the optimizer (not autocast)",
    ("fp16", False): "DeepSpeed fp16: fp16 params/grads/compute, fp32 master weights + Adam states, "
                     "dynamic loss scaling (skipped steps reported)",
    ("bf16", True): "DeepSpeed torch_autocast bf16: fp32 params (the master weights), forward under "
                    "torch.autocast",
    ("fp16", True): "DeepSpeed torch_autocast fp16: fp32 params, forward under torch.autocast, torch "
                    "GradScaler (skipped steps reported)",
}


class Zero(Strategy):
    """DeepSpeed engine over this rank's micro-batches; the engine owns reduction and stepping."""

    def setup(self) -> None:
        p, dev = self.plan, self.dist.device
        run = p.run
        self.arch_fix = fix_cuda_arch_list()  # before any op build
        self.extensions_dir = ensure_torch_extensions_dir()
        with self.setup_phase("import deepspeed"):
            import deepspeed

        self.ds_version = deepspeed.__version__
        if dev.type == "cpu":  # its shared-memory all-reduce serves inference_all_reduce (AutoTP inference) only,
            # which training never calls; unmarked, deepspeed.initialize JIT-builds it on a fresh host (86 s)
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        with self.setup_phase("bench model"):
            model = build_model(p.model, run.seed, dev)
        self.ac = apply_ac(model, p.layout)
        self.loss_info = apply_loss_chunks(model, p.layout.loss_chunks)
        self.ds_config = build_ds_config(p)
        o = run.optim
        kw = dict(lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
        if p.strategy.offload_optimizer != "none":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            self.optimizer_name = "deepspeed.ops.adam.DeepSpeedCPUAdam(adamw_mode=True)"
            make_opt = lambda params: DeepSpeedCPUAdam(params, adamw_mode=True, **kw)  # noqa: E731
        elif adam_of(p) == "deepspeed":  # CUDA only (bench/strategies/zero.py rules)
            from deepspeed.ops.adam import FusedAdam

            self.optimizer_name = "deepspeed.ops.adam.FusedAdam(adam_w_mode=True)"
            make_opt = lambda params: FusedAdam(params, adam_w_mode=True, **kw)  # noqa: E731
        else:  # torch's AdamW, as the torch-native strategies: its fused kernel on CUDA, no JIT build
            fused = dev.type == "cuda"
            self.optimizer_name = f"torch.optim.AdamW(fused={fused})"
            make_opt = lambda params: adamw(params, o, fused)  # noqa: E731
        with self.setup_phase("deepspeed.initialize (optimizer op load included)"):
            self.engine, _, _, _ = deepspeed.initialize(
                model=model, optimizer=make_opt, model_parameters=list(model.parameters()),
                config=copy.deepcopy(self.ds_config))
        if run.compile:
            self.engine.compile(compile_kwargs=compile_kwargs(run))
        self.stream = self.data_stream(self.dist.rank)
        self.steps_done = 0

    def step(self, n: int) -> StepResult:
        engine = self.engine
        micro = self.stream.micro_batches(n, self.plan.micro_batch_size)
        total = torch.zeros((), device=self.dist.device)
        scaler = self._autocast_grad_scaler()
        scale = None
        for i, (x, y) in enumerate(micro):
            loss = model_loss(engine, x, y, loss_chunks=self.plan.layout.loss_chunks)
            engine.backward(loss)  # DeepSpeed divides by gradient_accumulation_steps itself
            if scaler is not None and i == len(micro) - 1:
                # read at the boundary, after backward, as single does: GradScaler's step syncs
                # there anyway, while a read before the forward would stall the host every step
                scale = scaler.get_scale()
            engine.step()  # reduces and steps only at the accumulation boundary
            total += loss.detach()
        self.steps_done += 1
        if engine.global_steps != self.steps_done:
            raise RuntimeError(f"DeepSpeed took {engine.global_steps} optimizer steps for {self.steps_done} "
                               f"global batches (gradient_accumulation_steps={engine.gradient_accumulation_steps()})")
        skipped = scaler.get_scale() < scale if scaler is not None else not engine.was_step_applied()
        return StepResult(loss=total / len(micro), skipped=skipped)

    def _autocast_grad_scaler(self) -> Optional[torch.amp.GradScaler]:
        """The GradScaler of DeepSpeed's fp16 torch_autocast (the engine's at ZeRO-0, the ZeRO
        optimizer's at stages 1-3); None otherwise."""
        engine = self.engine
        return (getattr(engine, "torch_autocast_z0_gradscaler", None)
                or getattr(engine.optimizer, "torch_autocast_gradscaler", None))

    def _loss_scale(self) -> Optional[float]:
        """The current fp16 loss scale of DeepSpeed's optimizer wrapper (the attribute varies)."""
        opt = getattr(getattr(self, "engine", None), "optimizer", None)
        for attr in ("loss_scale", "cur_scale"):
            v = getattr(opt, attr, None)
            if isinstance(v, (int, float, torch.Tensor)):
                return float(v)
        return None

    def describe(self) -> dict:
        p = self.plan
        prec = p.run.precision
        autocast = bool(p.strategy.autocast) and prec != "fp32"
        engine = getattr(self, "engine", None)
        return {
            "impl": "deepspeed",
            "deepspeed_version": getattr(self, "ds_version", None),
            "zero_stage": p.strategy.zero_stage,
            "dp": p.dp_size,
            "offload_optimizer": p.strategy.offload_optimizer,
            "offload_param": p.strategy.offload_param,
            "optimizer": getattr(self, "optimizer_name", None),
            "optimizer_wrapper": type(engine.optimizer).__name__ if engine is not None else None,
            "autocast": autocast,
            "precision": PRECISION_NOTES[(prec, autocast)],
            "compile": bool(p.run.compile),
            "compiled": bool(engine.is_compiled) if engine is not None else False,
            "deepcompile": bool(engine.is_deepcompile_active()) if engine is not None else False,
            "micro_batch_size": p.micro_batch_size,
            "grad_accum": p.grad_accum,
            "global_steps": engine.global_steps if engine is not None else None,
            "global_samples": engine.global_samples if engine is not None else None,
            "skipped_steps": engine.skipped_steps if engine is not None else None,
            "loss_scale": self._loss_scale() if prec == "fp16" else None,
            "ds_config": getattr(self, "ds_config", None) or build_ds_config(p),
            "torch_cuda_arch_list_rewritten": getattr(self, "arch_fix", None),
            "torch_extensions_dir": getattr(self, "extensions_dir", None),
            "recompute": getattr(self, "ac", {}).get("recompute", p.layout.recompute),
            "activation_offload": getattr(self, "ac", {}).get("activation_offload"),
            "token_rule": "sum over data-parallel ranks",
            "comms": comms_calls() if engine is not None else None,
            **getattr(self, "loss_info", {}),
        }

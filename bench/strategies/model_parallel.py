"""The tp x pp x dp family's shared parts: one schema, its rules, its memory terms and its implementations.
The strategies ``tp`` (tp.py), ``pp`` (pp.py) and ``megatron`` (megatron/__init__.py) each register
themselves through ``family_spec``; they differ in defaults and tuning profiles.

``strategy.impl`` picks the implementation: ``megatron`` (megatron-core, GPU only:
bench/strategies/megatron/, imported only when a run needs it: ~5 s) or ``torch`` (DTensor tensor
parallelism and torch.distributed.pipelining, bench/parallel, through bench/strategies/torch_native.py;
runs on CPU too; its data-parallel replicas reduce through torch DDP).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Optional

from bench.layout_rules import check_torch_native
from bench.schema import (CUDA_GRAPH_CAPTURE_STEP, LAYOUT_DOCS, SCHEDULES, ConfigError, Plan, StrategyConfig,
                          alias_default, knob)
from bench.strategies.registry import ModelStates, StrategySpec, register
from bench.parallel.dp import TorchDDP
from bench.strategies.torch_native import torch_native
from bench.traffic import (all_gather, all_reduce, buckets, merge, param_tensors, pp_p2p, torch_native_hooks,
                           tp_activation)


@dataclass
class ModelParallelConfig(StrategyConfig):
    """One schema for the tp x pp x dp family.  dp = world_size / (tp * pp)."""

    name: str = "megatron"
    impl: str = knob("megatron", "megatron (megatron-core, GPU only) | torch (DTensor TP + torch.distributed."
                     "pipelining; runs on CPU too)", choices=("megatron", "torch"))
    tp: int = knob(1, LAYOUT_DOCS["tp"])
    pp: int = knob(1, LAYOUT_DOCS["pp"])
    microbatches: Any = knob(alias_default("microbatches", None), LAYOUT_DOCS["microbatches"])
    virtual_pipeline: int = knob(1, LAYOUT_DOCS["virtual_pipeline"])
    schedule: str = knob("auto", LAYOUT_DOCS["schedule"] + " (gpipe: torch only)", choices=SCHEDULES)
    sequence_parallel: bool = knob(False, "Megatron sequence parallelism: norms / dropout split over tp (needs tp > 1)")
    overlap_grad_reduce: bool = knob(True, "Megatron DDP: gradient reduction overlapped with backward")
    use_distributed_optimizer: bool = knob(False, "optimizer states sharded over dp, gradients reduce-scattered, "
                                           "parameters all-gathered after the step (ZeRO-1)", tune=(False, True))
    overlap_param_gather: bool = knob(False, "with the distributed optimizer: parameter all-gather overlapped with "
                                      "the next forward")
    bucket_size: Optional[int] = knob(None, "parameters per gradient bucket; null = Megatron's default")
    grad_reduce_in_fp32: bool = knob(True, "gradients reduced in fp32 (main grads)")
    fused_adam: bool = knob(True, "torch AdamW's fused kernel for megatron-core's fallback optimizer (no TE / Apex)")
    cuda_graph: bool = knob(False, "capture each step's forward + backward (all micro-batches, pipeline sends and "
                            "receives, the gradient reduction) as one CUDA graph, replayed from step "
                            f"{CUDA_GRAPH_CAPTURE_STEP} on", tune=(False, True))
    batch_p2p_sync: bool = knob(True, "a device sync after each batched pipeline send / receive (Megatron's "
                                "default; cuda_graph=true turns it off)")
    spec: str = knob("auto", "Megatron layer spec: auto (te if transformer_engine imports, else sdpa) | sdpa | "
                     "local | te", choices=("auto", "sdpa", "local", "te"))
    init: str = knob("bench", "bench: copy bench's initial weights (= strategy=single's) | megatron: Megatron's init",
                     choices=("bench", "megatron"))


MEGATRON_MODULES = ("megatron.core.parallel_state", "megatron.core.distributed", "megatron.core.optimizer",
                    "megatron.core.pipeline_parallel", "megatron.core.tensor_parallel",
                    "megatron.core.transformer.module", "bench.strategies.megatron.strategy",
                    "bench.strategies.megatron.model")


def implementation(plan: Plan):
    if plan.strategy["impl"] == "megatron":
        from bench.strategies.megatron.strategy import MegatronModelParallel

        return MegatronModelParallel
    return torch_native(TorchDDP())  # data-parallel replicas (tp = 1) reduce through torch DDP


def _megatron_core_installed() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        return False


def rules(plan: Plan) -> None:
    """Which implementation can run this plan, then the knobs' own rules."""
    _implementation_rules(plan)
    _knob_rules(plan)
    if plan.strategy["cuda_graph"]:
        _cuda_graph_rules(plan)


def _implementation_rules(plan: Plan) -> None:
    s, m, c = plan.strategy, plan.model, plan.cfg
    name, impl, tp, pp = s["name"], s["impl"], plan.tp, plan.pp
    if name == "megatron" and impl != "megatron":
        raise ConfigError("strategy.impl", impl, "strategy=megatron is megatron-core only; for torch-native "
                          "parallelism use strategy=tp or strategy=pp with strategy.impl=torch, or strategy=ddp")
    if impl == "megatron":
        fix = ("use strategy=ddp (or strategy=tp/pp with strategy.impl=torch)" if name == "megatron"
               else "use strategy.impl=torch (torch-native TP/PP, runs on CPU)")
        if c["precision"] == "fp8":
            raise ConfigError("strategy.impl", impl, "megatron-core's float8 needs Transformer Engine, which bench "
                              "does not run; precision=fp8 (torchao) runs with strategy.impl=torch, or strategy=fsdp "
                              f"strategy.tp={tp} precision=fp8")
        for key, plain in (("qkv_bias", False), ("mlp_act", "silu")):  # what bench's Megatron build does not map
            if m.get(key, plain) != plain:
                raise ConfigError(f"model.{key}", m[key], f"is not built by bench's megatron-core model (it would run "
                                  f"without it, not the model the record names); {fix}")
        if plan.device != "cuda":
            raise ConfigError("strategy.impl", impl, f"megatron-core needs CUDA GPUs, and this run has none "
                              f"(device={plan.device}); {fix}")
        if not _megatron_core_installed():
            raise ConfigError("strategy.impl", impl, f"megatron-core is not installed (pip install megatron-core); {fix}")
        if m["vocab_size"] % tp:
            raise ConfigError("strategy.tp", tp, f"must divide model.vocab_size={m['vocab_size']} "
                              "(Megatron splits the embedding and output layer over tp)")
    else:
        if c["precision"] == "fp16":
            raise ConfigError("precision", "fp16", "is not supported with strategy.impl=torch (no loss scaling "
                              "across shards and stages); use precision=bf16, or strategy.impl=megatron")
        check_torch_native(plan, shards_dtensors=False)
    sched = s["schedule"] if s["schedule"] != "auto" else ("interleaved_1f1b" if s["virtual_pipeline"] > 1 else "1f1b")
    if sched == "gpipe" and impl == "megatron":
        raise ConfigError("strategy.schedule", sched, "megatron-core has no GPipe schedule (it runs 1F1B); "
                          "use strategy.impl=torch for GPipe, or schedule=1f1b")
    if sched == "interleaved_1f1b" and impl == "megatron" and plan.grad_accum % pp:
        raise ConfigError("strategy.microbatches", s["microbatches"],
                          f"Megatron's interleaved schedule needs the number of micro-batches ({plan.grad_accum}) "
                          f"to be a multiple of strategy.pp={pp}")


def _knob_rules(plan: Plan) -> None:
    s, m, c = plan.strategy, plan.model, plan.cfg
    name, impl, tp = s["name"], s["impl"], plan.tp
    if s["sequence_parallel"]:
        if tp == 1:
            raise ConfigError("strategy.sequence_parallel", True, "needs strategy.tp > 1")
        if impl == "torch":
            raise ConfigError("strategy.sequence_parallel", True, "is implemented for strategy.impl=megatron only; "
                              "use sequence_parallel=false with impl=torch")
        if m["seq_len"] % tp:
            raise ConfigError("strategy.sequence_parallel", True, f"needs model.seq_len={m['seq_len']} divisible "
                              f"by strategy.tp={tp}")
    if c["compile"] and impl == "megatron":
        raise ConfigError("compile", True, f"is not implemented for strategy={name} with strategy.impl=megatron; "
                          "use compile=false (strategy.cuda_graph=true takes the launch cost off instead), or "
                          "strategy.impl=torch (compiles each transformer block)")
    if s["bucket_size"] is not None and s["bucket_size"] <= 0:
        raise ConfigError("strategy.bucket_size", s["bucket_size"], "must be a positive number of parameters, or null")
    if s["overlap_param_gather"] and not s["use_distributed_optimizer"]:
        raise ConfigError("strategy.overlap_param_gather", True, "needs strategy.use_distributed_optimizer=true")


def _cuda_graph_rules(plan: Plan) -> None:
    s, c = plan.strategy, plan.cfg
    if s["impl"] != "megatron":
        raise ConfigError("strategy.cuda_graph", True, "is implemented for strategy.impl=megatron only; "
                          "with impl=torch use compile=true")
    if s["overlap_param_gather"]:
        raise ConfigError("strategy.cuda_graph", True, "cannot capture strategy.overlap_param_gather's "
                          "forward hooks; set overlap_param_gather=false")
    if c["precision"] == "fp16":
        raise ConfigError("strategy.cuda_graph", True, "with precision=fp16: the dynamic loss scale is a new "
                          "tensor after each change, which a captured graph would not see; use bf16 or fp32")
    if c["warmup_steps"] <= CUDA_GRAPH_CAPTURE_STEP:
        raise ConfigError("warmup_steps", c["warmup_steps"], f"must be > {CUDA_GRAPH_CAPTURE_STEP} with "
                          f"strategy.cuda_graph=true: steps 0-{CUDA_GRAPH_CAPTURE_STEP - 1} run eagerly and step "
                          f"{CUDA_GRAPH_CAPTURE_STEP} is captured, so no timed step includes the capture")


def model_states(cfg: dict) -> ModelStates:
    """Megatron (Float16Module + DDP with grad_reduce_in_fp32): 16-bit params, fp32 main grads, fp32 main params
    + Adam m, v (18 B/param; 6 + 12/dp with the distributed optimizer); torch-native: replicated fp32."""
    s, prec = cfg["strategy"], cfg["precision"]
    if s["impl"] != "megatron":  # torch TP casts the attention's and MLP's inputs once (bench/parallel/tp.py)
        return ModelStates("fp32", shared_input_casts=s["tp"] > 1,
                           note=f"torch tp={s['tp']} pp={s['pp']}: fp32 weights, torch AdamW")
    scheme = "fp32" if prec == "fp32" else ("megatron_mixed" if s["grad_reduce_in_fp32"] else "mixed")
    return ModelStates(scheme, stage=1 if s["use_distributed_optimizer"] else 0, sixteen_bit_weights=True,
                       tp_splits_vocab=True,  # Float16Module; VocabParallelEmbedding and the parallel output layer
                       grads_live=True,  # Megatron DDP's contiguous main-grad buffers, allocated when it wraps
                       sequence_parallel=bool(s["sequence_parallel"]),
                       # vocab_parallel_cross_entropy works in place on one fp32 copy of the 16-bit logits (the
                       # softmax it saves becomes the gradient), whose 16-bit cast then flows back: 4 + 2 B
                       loss_bytes_per_logit=6,
                       # NVML used - reserved of one-GPU Megatron runs in results/ is 1.17 GiB above torch's: ~3
                       # communicators of its own parallel state (bench/memory_margins.py NCCL_COMM_BYTES)
                       extra_communicators=3, cuda_graph_pool=bool(s.get("cuda_graph")),
                       note=f"megatron tp={s['tp']} pp={s['pp']}"
                            + (" distributed optimizer" if s["use_distributed_optimizer"] else ""))


def buffers(plan: Plan, psi: float, per_block: float) -> tuple[float, str]:
    """torch-native replicas (dp > 1) reduce through torch DDP at its defaults (bench/parallel/dp.py): buckets
    beside the gradients (no gradient_as_bucket_view), rebuilt at step 2 except under a pipeline
    (find_unused_parameters).  Megatron's gradient buffers are its model states."""
    if plan.strategy["impl"] == "megatron":
        return 0.0, ""
    from bench.strategies.ddp import bucket_bytes

    return bucket_bytes(plan, psi, views=False, rebuilds=plan.pp == 1)


def process_env(plan: Plan) -> dict:
    """Megatron TP needs one CUDA connection (kernels start in issue order), set before CUDA starts."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if plan.strategy["impl"] == "megatron" and plan.tp > 1 else {}


def label(name: str, v: dict) -> list[str]:
    return [name] + ([f"impl={v['impl']}"] if v.get("impl") not in (None, "torch") and name != "megatron" else [])


# Megatron's host operations per parameter and micro-batch, eager (its Python gradient hook, the bucket's
# bookkeeping, the schedule's per-micro-batch work): gpt2 on one H200 ran 47.7-59.3 ms a step against single's
# 28.1-32.3, and 28.7-31.6 with cuda_graph on one H100 (results/2026-11-25-h200-search-1gpu, -h100-search-1gpu)
MEGATRON_PARAM_OPS = 3


def traffic(plan: Plan, params: float) -> dict[str, float]:
    """tp's activation all-reduces and pp's sends (bench/traffic.py), then the data-parallel reduction: Megatron
    DDP's buckets (fp32 main grads by default; reduce-scatter + parameter all-gather with the distributed
    optimizer), torch DDP's fp32 all-reduce.  Host: Megatron's Python gradient hooks per parameter and
    micro-batch, a device sync after each batched pipeline send / receive, the gradient norm read on the host;
    cuda_graph replays forward-backward (hooks, sends, reduction) as one graph."""
    s, dp = plan.strategy, plan.dp_size
    if s["impl"] != "megatron":
        grads = 4 * params
        own = {"grad_reduce": all_reduce(grads, dp), "collectives": buckets(grads, 25 * 2**20) if dp > 1 else 0,
               "hooks": param_tensors(plan) if plan.tp > 1 else 0}
        return merge(own, tp_activation(plan), pp_p2p(plan), torch_native_hooks(plan))
    grads = params * (4 if s["grad_reduce_in_fp32"] or plan.cfg["precision"] == "fp32" else 2)
    bucket = s["bucket_size"] or max(40_000_000, 1_000_000 * dp)  # Megatron's default bucket (parameters)
    graphed = s["cuda_graph"]
    own = {"syncs": 1 + (0 if graphed or not s["batch_p2p_sync"] or plan.pp == 1 else
                         2 * plan.grad_accum * s["virtual_pipeline"]),
           "hooks": 0 if graphed else MEGATRON_PARAM_OPS * param_tensors(plan) * plan.grad_accum,
           "graphed": 1 if graphed else 0}
    if dp > 1:
        kind = "grad_reduce" if s["overlap_grad_reduce"] else "tail"
        own["collectives"] = buckets(params, bucket) * (2 if s["use_distributed_optimizer"] else 1)
        if s["use_distributed_optimizer"]:
            gather = {"param_gather" if s["overlap_param_gather"] else "tail": all_gather(2 * params, dp)}
            return merge(own, {kind: all_gather(grads, dp)}, gather, tp_activation(plan), pp_p2p(plan))
        own[kind] = all_reduce(grads, dp)
    return merge(own, tp_activation(plan), pp_p2p(plan))


def family_spec(name: str, schema: type, summary: str, profiles: dict, float8: bool = False) -> StrategySpec:
    """Register one strategy of the family (its own module calls this: tp.py, pp.py, megatron/); ``float8``:
    precision=fp8 runs with strategy.impl=torch (torchao's float8 before TP / the pipeline split)."""
    return register(StrategySpec(
        name=name, schema=schema, summary=summary, implementation=implementation, rules=rules, float8=float8,
        model_states=model_states, buffers=buffers, process_env=process_env, profiles=profiles, label=label, traffic=traffic,
        preload=lambda s: MEGATRON_MODULES if s["impl"] == "megatron" else ()))


CUDA_GRAPHS_EVIDENCE = ("2 x H200, 300m: Megatron DDP=2 57% -> 79-85% of 2 x one GPU, TP=2 48.5% -> 61-64%, PP=2 m=4p "
                        "18% -> 65-68% (results/2026-11-22-h200x2-graphs-timing-teardown, "
                        "results/2026-11-23-h200x2-zero-fsdp-tp-pp)")

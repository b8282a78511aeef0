"""megatron-core as an implementation of the tp x pp x dp family (``strategy.impl=megatron``): its rules, memory
terms, traffic, environment and fork-server imports.  Light: megatron.core itself (~5 s) is imported only by
strategy.py / model.py, when a run uses it."""
from __future__ import annotations

import importlib.util

from bench.models.model_spec import describe_model
from bench.spec.layout_rules import build as build_layout, microbatches_setting
from bench.spec.schema import BenchConfig, ConfigError, ModelConfig, Plan
from bench.strategies.model_parallel import Implementation, register_implementation
from bench.strategies.registry import FP32, MIXED, ModelStates, Scheme
from bench.costs.traffic import all_gather, all_reduce, buckets, merge, param_tensors, pp_p2p, tp_activation

NAME = "megatron"  # the strategy.impl value, and the strategy of the same name (megatron/__init__.py)

# Float16Module, fp32 main grads (grad_reduce_in_fp32), fp32 main params + Adam m, v
MIXED_FP32_GRADS = Scheme("megatron_mixed", 2, 4, 12)

PRELOAD = ("megatron.core.parallel_state", "megatron.core.distributed", "megatron.core.optimizer",
           "megatron.core.pipeline_parallel", "megatron.core.tensor_parallel", "megatron.core.transformer.module",
           "bench.strategies.megatron.strategy", "bench.strategies.megatron.model")

# Megatron's host operations per parameter and micro-batch, eager (its Python gradient hook, the bucket's
# bookkeeping, the schedule's per-micro-batch work): gpt2 on one H200 ran 47.7-59.3 ms a step against single's
# 28.1-32.3, and 28.7-31.6 with cuda_graph on one H100 (results/2026-11-25-h200-search-1gpu, -h100-search-1gpu)
PARAM_OPS = 3


def runner(plan: Plan):
    from bench.strategies.megatron.strategy import MegatronModelParallel

    return MegatronModelParallel


def megatron_only(plan: Plan) -> None:
    """strategy=megatron's own rule: it has no other implementation."""
    if plan.strategy.impl != NAME:
        raise ConfigError("strategy.impl", plan.strategy.impl, "strategy=megatron is megatron-core only; for "
                          "torch-native parallelism use strategy=tp or strategy=pp with strategy.impl=torch, or "
                          "strategy=ddp")


def _installed() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        return False


def rules(plan: Plan) -> None:
    """What megatron-core can run: CUDA, installed, no float8, the model bench's Megatron build maps, tp dividing
    the vocabulary; its schedules."""
    s, m, c = plan.strategy, plan.model, plan.run
    impl, tp, pp = s.impl, plan.tp, plan.pp
    fix = ("use strategy=ddp (or strategy=tp/pp with strategy.impl=torch)" if s.name == NAME
           else "use strategy.impl=torch (torch-native TP/PP, runs on CPU)")
    if plan.layout.recompute_every != 1:
        raise ConfigError("recompute_every", plan.layout.recompute_every, "megatron-core's partial recompute "
                          "checkpoints the first N layers of a stage (recompute_method=block), not every k-th: not "
                          f"wired here; use recompute_every=1, or {fix}")
    if plan.layout.recompute == "op":
        raise ConfigError("recompute", "op", "torch's op-level selective checkpointing is not megatron-core's: it "
                          "offers recompute=full (whole layers) and recompute=selective (its core attention); use one "
                          f"of those, or {fix}")
    if not s.grad_reduce_in_fp32 and c.precision == "fp32":  # fp32 main grads either way
        raise ConfigError("strategy.grad_reduce_in_fp32", False, "takes effect only with precision=bf16 or fp16 (with "
                          "precision=fp32 the gradients are fp32 already); leave strategy.grad_reduce_in_fp32=true "
                          "(the default) or use precision=bf16")
    if plan.layout.offload_activations:
        raise ConfigError("offload_activations", True, "megatron-core's activation offload (cpu_offloading) runs "
                          f"through Transformer Engine, which bench does not run; use offload_activations=false, or {fix}")
    if c.precision == "fp8":
        raise ConfigError("strategy.impl", impl, "megatron-core's float8 needs Transformer Engine, which bench "
                          "does not run; precision=fp8 (torchao) runs with strategy.impl=torch, or strategy=fsdp "
                          f"strategy.tp={tp} precision=fp8")
    for key, plain in (("qkv_bias", False), ("mlp_act", "silu")):  # what bench's Megatron build does not map
        if getattr(m, key) != plain:
            raise ConfigError(f"model.{key}", getattr(m, key), f"is not built by bench's megatron-core model (it would run "
                              f"without it, not the model the record names); {fix}")
    if plan.device != "cuda":
        raise ConfigError("strategy.impl", impl, f"megatron-core needs CUDA GPUs, and this run has none "
                          f"(device={plan.device}); {fix}")
    if not _installed():
        raise ConfigError("strategy.impl", impl, f"megatron-core is not installed (pip install megatron-core); {fix}")
    if m.vocab_size % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.vocab_size={m.vocab_size} "
                          "(Megatron splits the embedding and output layer over tp)")
    sched = plan.layout.schedule
    if sched == "gpipe":
        raise ConfigError("strategy.schedule", sched, "megatron-core has no GPipe schedule (it runs 1F1B); "
                          "use strategy.impl=torch for GPipe, or schedule=1f1b")
    if sched == "interleaved_1f1b" and plan.grad_accum % pp:
        raise ConfigError("strategy.microbatches", microbatches_setting(s),
                          f"Megatron's interleaved schedule needs the number of micro-batches ({plan.grad_accum}) "
                          f"to be a multiple of strategy.pp={pp}")


def model_states(run: BenchConfig) -> ModelStates:
    """Float16Module + DDP with grad_reduce_in_fp32: 16-bit params, fp32 main grads, fp32 main params + Adam m, v
    (18 B/param; 6 + 12/dp with the distributed optimizer)."""
    s, prec, lay = run.strategy, run.precision, build_layout(run)
    scheme = FP32 if prec == "fp32" else (MIXED_FP32_GRADS if s.grad_reduce_in_fp32 else MIXED)
    return ModelStates(scheme, stage=1 if s.use_distributed_optimizer else 0, sixteen_bit_weights=True,
                       tp_splits_vocab=True,  # Float16Module; VocabParallelEmbedding and the parallel output layer
                       grads_live=True,  # Megatron DDP's contiguous main-grad buffers, allocated when it wraps
                       sequence_parallel=bool(s.sequence_parallel),
                       # vocab_parallel_cross_entropy works in place on one fp32 copy of the 16-bit logits (the
                       # softmax it saves becomes the gradient), whose 16-bit cast then flows back: 4 + 2 B
                       loss_bytes_per_logit=6,
                       # NVML used - reserved of one-GPU Megatron runs in results/ is 1.17 GiB above torch's: ~3
                       # communicators of its own parallel state (bench/plan/memory_margins.py NCCL_COMM_BYTES)
                       extra_communicators=3, cuda_graph_pool=bool(s.cuda_graph),
                       extra_saved_per_token=layer_extra_saved(run.model),
                       note=f"megatron tp={lay.tp} pp={lay.pp}"
                            + (" distributed optimizer" if s.use_distributed_optimizer else ""))


def layer_extra_saved(m: ModelConfig) -> float:
    """Elements per token a megatron-core layer of bench's llama build keeps beyond bench's own layer: SDPA saves
    the value as a view of the fused QKV projection's output, so the whole output stays alive beside the rotated
    query and key (its q and k parts: d + kv_dim); its GLU adds ``glu_linear_offset`` (0.0) to the linear half,
    a new ffn-sized tensor the product saves (megatron/core/transformer/mlp.py).  The GPT build (no rotary, no
    GLU) saves what bench's does.  Checked on one H200 (results/2026-12-02-h200x1-megatron-memory)."""
    desc = describe_model(m)
    rotated = desc.d + desc.kv_dim if desc.rotary else 0  # without rotary, q and k are views of that output too
    glu_copy = desc.ff if desc.mlp_inputs == 2 else 0
    return rotated + glu_copy


def buffers(plan: Plan, psi: float, per_block: float) -> tuple[float, str]:
    """Megatron's gradient buffers are its model states."""
    return 0.0, ""


def traffic(plan: Plan, params: float) -> dict[str, float]:
    """Megatron DDP's buckets (fp32 main grads by default; reduce-scatter + parameter all-gather with the
    distributed optimizer) beside tp's and pp's traffic.  Host: its Python gradient hooks per parameter and
    micro-batch, a device sync after each batched pipeline send / receive, the gradient norm read on the host;
    cuda_graph replays forward-backward (hooks, sends, reduction) as one graph."""
    s, dp = plan.strategy, plan.dp_size
    elem = 4 if s.grad_reduce_in_fp32 or plan.run.precision == "fp32" else 2  # bytes of a main grad
    grads = params * elem
    bucket = s.bucket_size or max(40_000_000, 1_000_000 * dp)  # Megatron's default bucket (parameters)
    graphed = s.cuda_graph
    own = {"syncs": 1 + (0 if graphed or not s.batch_p2p_sync or plan.pp == 1 else
                         2 * plan.grad_accum * plan.layout.virtual_pipeline),
           "hooks": 0 if graphed else PARAM_OPS * param_tensors(plan) * plan.grad_accum,
           "graphed": 1 if graphed else 0}
    if plan.layout.recompute == "full":  # its recompute reruns a layer's whole forward, the last matmul too
        m = plan.model
        own["extra_flops"] = (describe_model(m).checkpoint_skipped_flops_per_token() * m.global_batch * m.seq_len
                              / plan.world_size)
    if plan.pp > 1 and plan.model.tie_embeddings:
        # the tied word embedding lives on the first and the last stage: finalize_model_grads all-reduces its
        # (vocab-parallel) main grad between the two after every backward (_allreduce_word_embedding_grads)
        m = plan.model
        own.update(embedding_grad=all_reduce(m.vocab_size * m.d_model / plan.tp * elem, 2),
                   collectives=1, grad_elem=elem)  # a gradient sum too, in the main grads' dtype
    if dp > 1:
        own["grad_elem"] = elem
        kind = "grad_reduce" if s.overlap_grad_reduce else "tail"
        own["collectives"] = own.get("collectives", 0) + buckets(params, bucket) * (2 if s.use_distributed_optimizer else 1)
        if s.use_distributed_optimizer:
            gather = {"param_gather" if s.overlap_param_gather else "tail": all_gather(2 * params, dp)}
            return merge(own, {kind: all_gather(grads, dp)}, gather, tp_activation(plan), pp_p2p(plan))
        own[kind] = all_reduce(grads, dp)
    return merge(own, tp_activation(plan), pp_p2p(plan))


def env(plan: Plan) -> dict[str, str]:
    """Megatron TP needs one CUDA connection (kernels start in issue order), set before CUDA starts."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if plan.tp > 1 else {}


MEGATRON_CORE = register_implementation(Implementation(
    name=NAME, runner=runner, rules=rules, model_states=model_states, buffers=buffers, traffic=traffic, env=env,
    preload=PRELOAD, label=(f"impl={NAME}",),
    refuses={"compile": "is not implemented for strategy={name} with strategy.impl=megatron; use compile=false "
                        "(strategy.cuda_graph=true takes the launch cost off instead), or strategy.impl=torch "
                        "(compiles each transformer block)",
             "strategy.cp": "is not available with strategy.impl=megatron here: megatron-core exchanges K/V for "
                            "context parallelism only inside Transformer Engine's attention (its local "
                            "DotProductAttention asserts context_parallel_size == 1), and bench runs megatron-core "
                            "without Transformer Engine; use strategy=fsdp strategy.cp=... (PyTorch's "
                            "context_parallel)",
             "loss_chunks": "is not implemented for strategy.impl=megatron: megatron-core computes its own "
                            "vocab-parallel cross entropy (in place, 6 B a logit); use loss_chunks=1, or strategy.impl="
                            "torch (bench's model computes the chunked loss)"}))

"""A run's layout: built and checked here, once, from the configuration; read as ``plan.layout`` after.

``build`` (bench/run/config.py's validation, for every strategy): the strategy's layout knobs (``tp``, ``pp``,
``virtual_pipeline``, ``schedule``, ``microbatches``, ``micro_batch_size``, ``dp_replicate``: those its schema
has) and ``recompute`` become the frozen :class:`bench.spec.layout.Layout`, after the rules that make it one: the
sizes split the world, the batch and the model evenly, the pipeline schedule fits the virtual stages, and
``strategy.microbatches`` resolves into the micro-batch size and count.  ``check_torch_native`` (the
torch-native strategies' rules, bench/strategies): what torch's own TP / pipelining / DDP cannot do with such a
layout.  What one library cannot do (megatron-core's schedules, say) stays with its strategy.
"""
from __future__ import annotations

from typing import Any

from bench.spec.layout import Layout, resolve_microbatches, resolve_schedule
from bench.spec.schema import BenchConfig, ConfigError, ModelConfig, Plan, check_positive


def build(c: BenchConfig) -> Layout:
    """The layout of a typed run description (its strategy's layout knobs: those its schema has), or a
    ConfigError naming the knob."""
    s, m, ws = c.strategy, c.model, c.world_size
    tp, pp, cp = getattr(s, "tp", 1), getattr(s, "pp", 1), getattr(s, "cp", 1)
    for key, size in (("tp", tp), ("pp", pp), ("cp", cp)):
        check_positive(f"strategy.{key}", size)
    if ws % (tp * pp * cp):
        raise ConfigError("world_size", ws, f"must be a multiple of strategy.tp x strategy.pp x strategy.cp = "
                          f"{tp} x {pp} x {cp} = {tp * pp * cp}")
    dp = ws // (tp * pp * cp)
    if cp > 1:
        _check_context(m, s, cp)
    mbs, n_micro = _micro_batch(m, s, dp, ws)
    v, sched = 1, resolve_schedule("auto", 1)
    if splits_model(s):  # a strategy that splits the model: its shapes, pipeline and micro-batch count
        _check_shapes(m, tp)
        v, sched = _pipeline(m, s, pp)
        if s.microbatches is not None:
            mbs, n_micro = _microbatch_count(m, s, pp, dp)
    return Layout(tp=tp, pp=pp, dp=dp, cp=cp, dp_replicate=_replicas(s, ws, tp, pp, dp), virtual_pipeline=v,
                  schedule=sched, micro_batch_size=mbs, grad_accum=n_micro, recompute=c.recompute,
                  recompute_every=_recompute_every(c), loss_chunks=_loss_chunks(c, pp, cp),
                  offload_activations=_offload_activations(c))


CP_CHUNK_ROWS = 32  # measured: a 16-row chunk fails in torch 2.11's ring merge (fp32, memory-efficient kernel)


def _check_context(m: ModelConfig, s: Any, cp: int) -> None:
    """What context parallelism splits: the sequence into 2 x cp chunks (each rank one from the head and its mirror
    from the tail, so causal work is even); not with a pipeline (not implemented here)."""
    if m.seq_len % (CP_CHUNK_ROWS * 2 * cp):
        raise ConfigError("strategy.cp", cp, f"needs model.seq_len={m.seq_len} divisible by {CP_CHUNK_ROWS} x 2 x "
                          f"cp = {CP_CHUNK_ROWS * 2 * cp}: the sequence is cut into 2 x cp load-balanced chunks, each a "
                          f"multiple of {CP_CHUNK_ROWS} rows (the memory-efficient attention kernel pads its log-sum-exp "
                          f"to {CP_CHUNK_ROWS} rows, which torch's ring cannot merge)")
    if getattr(s, "pp", 1) > 1:
        raise ConfigError("strategy.cp", cp, f"with strategy.pp={s.pp} is not implemented; use strategy.pp=1 "
                          "with cp > 1 (context parallelism composes with FSDP2, HSDP and tp here)")


def _recompute_every(c: BenchConfig) -> int:
    """recompute_every: a positive count, and only where it acts (recompute=full)."""
    every = c.recompute_every
    check_positive("recompute_every", every)
    if every != 1 and c.recompute != "full":
        raise ConfigError("recompute_every", every, f"acts with recompute=full (which blocks to checkpoint; "
                          f"recompute=op checkpoints every block, as torchtitan's); recompute={c.recompute}: leave "
                          f"it 1 or set recompute=full")
    return every


def _loss_chunks(c: BenchConfig, pp: int, cp: int) -> int:
    """loss_chunks: a positive count; > 1 only without a pipeline, whose last stage's loss runs in the schedule's
    loss_fn, outside the stage module that owns the head (where FSDP2 / ZeRO-3 gather its weight), and without
    context parallelism (CUDA only: not yet run against cp=1's losses)."""
    k = c.loss_chunks
    check_positive("loss_chunks", k)
    if k > 1 and pp > 1:
        raise ConfigError("loss_chunks", k, f"the chunked loss is not implemented for pipelines (strategy.pp={pp}: "
                          "the schedule computes the loss outside the last stage); use loss_chunks=1 or strategy.pp=1")
    if k > 1 and cp > 1:
        raise ConfigError("loss_chunks", k, f"with strategy.cp={cp} is not enabled: context parallelism runs on CUDA "
                          "only and the chunked loss has not been checked loss-equal under it; use loss_chunks=1")
    return k


def _offload_activations(c: BenchConfig) -> bool:
    """offload_activations: eager only.  torch's save_on_cpu brings saved tensors back contiguous, and a compiled
    backward asserts the strides it saved them with (llama3_1b on an H200, torch 2.11: "expected size 8==8, stride
    131072==64 at dim=1")."""
    if c.offload_activations and c.compile:
        raise ConfigError("offload_activations", True, "with compile=true fails in the compiled backward: torch's "
                          "save_on_cpu returns saved tensors contiguous and the compiled graph checks their strides; "
                          "use compile=false with it, or offload_activations=false")
    return c.offload_activations


def _micro_batch(m: ModelConfig, s: Any, dp: int, ws: int) -> tuple[int, int]:
    """strategy.micro_batch_size: a divisor of the per-rank batch, or all of it (null; auto, until the memory
    plan chooses in bench/run/config.py)."""
    gb = m.global_batch
    if gb % dp:
        raise ConfigError("model.global_batch", gb,
                          f"must be divisible by the data-parallel size {dp} (world_size={ws})")
    per_rank = gb // dp
    auto = s.micro_batch_size == "auto"
    mbs = per_rank if auto else s.micro_batch_size or per_rank
    if not isinstance(mbs, int) or isinstance(mbs, bool) or mbs <= 0 or per_rank % mbs:
        raise ConfigError("strategy.micro_batch_size", s.micro_batch_size,
                          f"must divide the per-rank batch {per_rank} (= global_batch {gb} / dp {dp}), or be auto "
                          "(the largest the memory plan fits) or null (all of it)")
    if auto and getattr(s, "microbatches", None) is not None:
        raise ConfigError("strategy.micro_batch_size", "auto", f"conflicts with strategy.microbatches="
                          f"{s.microbatches}, which sets the micro-batches; set only one of them")
    return mbs, per_rank // mbs


def _check_shapes(m: ModelConfig, tp: int) -> None:
    """What tensor parallelism splits: attention heads, key/value heads, the MLP."""
    kv = m.n_kv_heads or m.n_heads
    if m.n_heads % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.n_heads={m.n_heads} (attention heads are split over tp)")
    if kv % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.n_kv_heads={kv} (key/value heads are split over tp)")
    if m.d_ff % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.d_ff={m.d_ff} (the MLP is split over tp)")


def _pipeline(m: ModelConfig, s: Any, pp: int) -> tuple[int, str]:
    """Virtual stages that split the layers evenly, and the schedule resolved for them."""
    v = s.virtual_pipeline
    check_positive("strategy.virtual_pipeline", v)
    if v > 1 and pp == 1:
        raise ConfigError("strategy.virtual_pipeline", v, "interleaved stages need strategy.pp > 1; use virtual_pipeline=1")
    if m.n_layers % (pp * v):
        raise ConfigError("strategy.pp", pp, f"strategy.pp x strategy.virtual_pipeline = {pp} x {v} = {pp * v} "
                          f"stages must divide model.n_layers={m.n_layers}")
    sched = resolve_schedule(s.schedule, v)
    if sched == "interleaved_1f1b" and v < 2:
        raise ConfigError("strategy.schedule", sched, "needs strategy.virtual_pipeline >= 2 (model chunks per "
                          "pipeline rank); or use schedule=1f1b / gpipe")
    if sched in ("gpipe", "1f1b") and v > 1:
        raise ConfigError("strategy.schedule", sched, f"runs one stage per rank, but strategy.virtual_pipeline={v}; "
                          "use schedule=interleaved_1f1b (or auto), or virtual_pipeline=1")
    return v, sched


def _microbatch_count(m: ModelConfig, s: Any, pp: int, dp: int) -> tuple[int, int]:
    """strategy.microbatches resolved ("4p" -> 4 x pp) into the micro-batch size and count."""
    per_rank = m.global_batch // dp
    try:
        n_micro = resolve_microbatches(s.microbatches, pp)
    except ValueError:
        raise ConfigError("strategy.microbatches", s.microbatches,
                          'must be "p", "<k>p" (k x strategy.pp), a positive integer, or null') from None
    if per_rank % n_micro:
        raise ConfigError("strategy.microbatches", s.microbatches,
                          f"= {n_micro} micro-batches must divide the per-data-parallel-rank batch {per_rank} "
                          f"(= model.global_batch {m.global_batch} / dp {dp}); use fewer micro-batches "
                          "or a larger model.global_batch")
    mbs = per_rank // n_micro
    if s.micro_batch_size not in (None, mbs):
        raise ConfigError("strategy.micro_batch_size", s.micro_batch_size,
                          f"conflicts with strategy.microbatches={s.microbatches} ({n_micro} micro-batches "
                          f"of {mbs}); set only one of them")
    return mbs, n_micro


def _replicas(s: Any, ws: int, tp: int, pp: int, dp: int) -> int:
    """strategy.dp_replicate (HSDP, where the strategy has it): replicas that divide the data-parallel ranks."""
    r = getattr(s, "dp_replicate", 1)
    if isinstance(r, bool) or not isinstance(r, int) or r < 1 or dp % r:
        valid = ", ".join(str(d) for d in range(1, dp + 1) if dp % d == 0)
        raise ConfigError("strategy.dp_replicate", r, f"must divide the data-parallel size {dp} (world_size "
                          f"{ws} / (tp {tp} x pp {pp})); valid: {valid}")
    return r


def splits_model(strategy: Any) -> bool:
    """The strategy's schema has the layout knobs (tp, pp, the pipeline's, the micro-batch count: bench/spec/schema.py
    LayoutKnobs)."""
    return hasattr(strategy, "tp")


def microbatches_setting(strategy: Any) -> Any:
    """strategy.microbatches as set ("4p", 8, null: plan.layout holds the resolved count), for what an error or a
    record names; None where the strategy has no such knob."""
    return getattr(strategy, "microbatches", None)


def check_torch_native(plan: Plan, shards_dtensors: bool) -> None:
    """torch-native TP / pipelining: no loss scaling across shards and stages, no embedding shared by two
    pipeline stages, 1F1B's micro-batch per stage, interleaved 1F1B's rounds, and DDP's replicas cannot hold
    DTensors (``shards_dtensors``: FSDP2 can)."""
    s, m, tp, pp, dp = plan.strategy, plan.model, plan.tp, plan.pp, plan.dp_size
    if plan.run.precision == "fp16" and (tp > 1 or pp > 1):
        raise ConfigError("precision", "fp16", "loss scaling across tensor-parallel shards and pipeline stages is not "
                          "implemented for torch-native TP / PP; use precision=bf16")
    if tp > 1 and dp > 1 and not shards_dtensors:
        raise ConfigError("world_size", plan.world_size,
                          f"gives tp={tp} x pp={pp} x dp={dp}: torch's DistributedDataParallel does not take "
                          "tensor-parallel (DTensor) parameters; for TP with data parallelism use strategy=fsdp "
                          f"strategy.tp={tp} (FSDP2 x TP), or strategy.impl=megatron")
    if pp > 1 and m.tie_embeddings:
        raise ConfigError("model.tie_embeddings", True, "the torch-native pipeline cannot share the embedding between "
                          "its first and last stage; use model.tie_embeddings=false, strategy.pp=1, or "
                          "strategy.impl=megatron")
    sched = plan.layout.schedule
    if pp > 1 and sched == "1f1b" and plan.grad_accum < pp:
        _too_few_microbatches(plan)
    if sched == "interleaved_1f1b" and plan.grad_accum % max(1, plan.grad_accum // pp):
        raise ConfigError("strategy.microbatches", s.microbatches,
                          f"torch's interleaved 1F1B needs the number of micro-batches ({plan.grad_accum}) to be a "
                          f"multiple of its rounds max(1, {plan.grad_accum} // pp)")


def _too_few_microbatches(plan: Plan) -> None:
    """torch's Schedule1F1B refuses fewer micro-batches than stages (its warm-up fills the pipeline): refused here,
    before a process starts, with the counts that divide the per-rank batch."""
    pp, n = plan.pp, plan.grad_accum
    per_rank = plan.layout.per_rank_batch
    counts = [f'{k} ("p")' if k == pp else str(k) for k in range(pp, per_rank + 1) if per_rank % k == 0]
    valid = (f"a count of at least {pp} dividing the per-data-parallel-rank batch {per_rank}: {', '.join(counts)}"
             if counts else f"none: the per-data-parallel-rank batch is {per_rank}, raise model.global_batch to at "
             f"least {pp} x dp {plan.dp_size}")
    raise ConfigError("strategy.microbatches", plan.strategy.microbatches,
                      f"gives {n} micro-batch{'es' if n != 1 else ''} of {plan.micro_batch_size} a step, but torch's "
                      f"1F1B schedule needs at least one per pipeline stage (strategy.pp={pp}); valid: {valid} "
                      "(strategy.microbatches=..., or the shorthand microbatches=...), or strategy.schedule=gpipe")

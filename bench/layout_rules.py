"""Validation of a ``tp x pp x dp`` layout: the one place its rules live.

``check_split`` (bench/config.py, for every strategy whose schema has ``tp``): the shapes tensor and
pipeline parallelism must split evenly, the pipeline schedule, and ``strategy.microbatches``
resolved into the plan's micro-batch size and count.  ``check_torch_native`` (the torch-native
strategies' rules, bench/strategies): what torch's own TP / pipelining / DDP cannot do with such a
layout.  What one library cannot do (megatron-core's schedules, say) stays with its strategy.
"""
from __future__ import annotations

from bench.layout import resolve_microbatches, resolve_schedule
from bench.schema import ConfigError, Plan, check_positive


def check_split(plan: Plan) -> None:
    """Shapes that tensor / pipeline parallelism split evenly, the pipeline schedule, and
    ``strategy.microbatches`` resolved into plan.micro_batch_size / plan.grad_accum."""
    s, m = plan.strategy, plan.model
    tp, pp, dp = plan.tp, plan.pp, plan.dp_size
    kv = m.get("n_kv_heads") or m["n_heads"]
    if m["n_heads"] % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.n_heads={m['n_heads']} (attention heads are split over tp)")
    if kv % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.n_kv_heads={kv} (key/value heads are split over tp)")
    if m["d_ff"] % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.d_ff={m['d_ff']} (the MLP is split over tp)")
    v = s.get("virtual_pipeline", 1)
    check_positive("strategy.virtual_pipeline", v)
    if v > 1 and pp == 1:
        raise ConfigError("strategy.virtual_pipeline", v, "interleaved stages need strategy.pp > 1; use virtual_pipeline=1")
    if m["n_layers"] % (pp * v):
        raise ConfigError("strategy.pp", pp, f"strategy.pp x strategy.virtual_pipeline = {pp} x {v} = {pp * v} "
                          f"stages must divide model.n_layers={m['n_layers']}")
    sched = resolve_schedule(s.get("schedule", "auto"), v)
    if sched == "interleaved_1f1b" and v < 2:
        raise ConfigError("strategy.schedule", sched, "needs strategy.virtual_pipeline >= 2 (model chunks per "
                          "pipeline rank); or use schedule=1f1b / gpipe")
    if sched in ("gpipe", "1f1b") and v > 1:
        raise ConfigError("strategy.schedule", sched, f"runs one stage per rank, but strategy.virtual_pipeline={v}; "
                          "use schedule=interleaved_1f1b (or auto), or virtual_pipeline=1")
    per_rank = m["global_batch"] // dp
    if s.get("microbatches") is not None:
        try:
            n_micro = resolve_microbatches(s["microbatches"], pp)
        except ValueError:
            raise ConfigError("strategy.microbatches", s["microbatches"],
                              'must be "p", "<k>p" (k x strategy.pp), a positive integer, or null') from None
        if per_rank % n_micro:
            raise ConfigError("strategy.microbatches", s["microbatches"],
                              f"= {n_micro} micro-batches must divide the per-data-parallel-rank batch {per_rank} "
                              f"(= model.global_batch {m['global_batch']} / dp {dp}); use fewer micro-batches "
                              "or a larger model.global_batch")
        mbs = per_rank // n_micro
        if s.get("micro_batch_size") not in (None, mbs):
            raise ConfigError("strategy.micro_batch_size", s["micro_batch_size"],
                              f"conflicts with strategy.microbatches={s['microbatches']} ({n_micro} micro-batches "
                              f"of {mbs}); set only one of them")
        plan.micro_batch_size, plan.grad_accum = mbs, n_micro


def check_torch_native(plan: Plan, shards_dtensors: bool) -> None:
    """torch-native TP / pipelining: no loss scaling across shards and stages, no embedding shared by two
    pipeline stages, 1F1B's micro-batch per stage, interleaved 1F1B's rounds, and DDP's replicas cannot hold
    DTensors (``shards_dtensors``: FSDP2 can)."""
    s, m, tp, pp, dp = plan.strategy, plan.model, plan.tp, plan.pp, plan.dp_size
    if plan.cfg["precision"] == "fp16" and (tp > 1 or pp > 1):
        raise ConfigError("precision", "fp16", "loss scaling across tensor-parallel shards and pipeline stages is not "
                          "implemented for torch-native TP / PP; use precision=bf16")
    if tp > 1 and dp > 1 and not shards_dtensors:
        raise ConfigError("world_size", plan.world_size,
                          f"gives tp={tp} x pp={pp} x dp={dp}: torch's DistributedDataParallel does not take "
                          "tensor-parallel (DTensor) parameters; for TP with data parallelism use strategy=fsdp "
                          f"strategy.tp={tp} (FSDP2 x TP), or strategy.impl=megatron")
    if pp > 1 and m.get("tie_embeddings"):
        raise ConfigError("model.tie_embeddings", True, "the torch-native pipeline cannot share the embedding between "
                          "its first and last stage; use model.tie_embeddings=false, strategy.pp=1, or "
                          "strategy.impl=megatron")
    sched = resolve_schedule(s.get("schedule", "auto"), s.get("virtual_pipeline", 1))
    if pp > 1 and sched == "1f1b" and plan.grad_accum < pp:
        _too_few_microbatches(plan)
    if sched == "interleaved_1f1b" and plan.grad_accum % max(1, plan.grad_accum // pp):
        raise ConfigError("strategy.microbatches", s["microbatches"],
                          f"torch's interleaved 1F1B needs the number of micro-batches ({plan.grad_accum}) to be a "
                          f"multiple of its rounds max(1, {plan.grad_accum} // pp)")


def _too_few_microbatches(plan: Plan) -> None:
    """torch's Schedule1F1B refuses fewer micro-batches than stages (its warm-up fills the pipeline): refused here,
    before a process starts, with the counts that divide the per-rank batch."""
    pp, n = plan.pp, plan.grad_accum
    per_rank = plan.micro_batch_size * n
    counts = [f'{k} ("p")' if k == pp else str(k) for k in range(pp, per_rank + 1) if per_rank % k == 0]
    valid = (f"a count of at least {pp} dividing the per-data-parallel-rank batch {per_rank}: {', '.join(counts)}"
             if counts else f"none: the per-data-parallel-rank batch is {per_rank}, raise model.global_batch to at "
             f"least {pp} x dp {plan.dp_size}")
    raise ConfigError("strategy.microbatches", plan.strategy.get("microbatches"),
                      f"gives {n} micro-batch{'es' if n != 1 else ''} of {plan.micro_batch_size} a step, but torch's "
                      f"1F1B schedule needs at least one per pipeline stage (strategy.pp={pp}); valid: {valid} "
                      "(strategy.microbatches=..., or the shorthand microbatches=...), or strategy.schedule=gpipe")

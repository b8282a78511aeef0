"""torch.compile per transformer block (after TP and recomputation, before FSDP2 / DDP, as torchtitan):
a wrapper's hooks stay outside the graphs, and DTensor's dispatch is traced away."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bench.spec.schema import BenchConfig, ConfigError, Plan

if TYPE_CHECKING:  # annotations only: the rules here are read by validation, which never imports torch
    import torch.nn as nn

log = logging.getLogger("bench.compile")

# torch._dynamo's compile-time metrics worth a record: the forward's capture and compile (the backend's share in
# it) and the backward's compile, which runs at the first backward
COMPILE_PHASES = {"forward capture and compile": "_compile.compile_inner",
                  "of it the backend": "OutputGraph.call_user_compiler",
                  "backward compile": "compile_fx.<locals>.bw_compiler"}
CACHES = {"inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss"),
          "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss")}


# CUDA graphs (compile_mode=reduce-overhead) over several micro-batches of a step, where each micro-batch's backward
# leaves its gradients in param.grad for the next one to add to: one H100, Llama 3.2 1B, micro-batch 4 of 8 (2
# micro-batches), DDP at one rank and ZeRO-1 failed in their first step, the next graph replay having overwritten a
# tensor the gradient accumulation still read; ZeRO-2, whose hooks move every gradient out each micro-batch, ran
# (results/2026-12-06-h100x1-graphs-and-host).  No step with graphs and accumulation has completed otherwise.
GRAPHS_ACROSS_MICROBATCHES = ("CUDA graphs over {n} micro-batches a step (strategy.micro_batch_size={mb} of a per-rank "
                              "batch of {batch}): the next replay overwrites what the gradient accumulation still "
                              "reads (one H100, Llama 3.2 1B, 2 micro-batches: DDP and ZeRO-1 failed in their first "
                              "step; results/2026-12-06-h100x1-graphs-and-host); use compile_mode=default, or one "
                              "micro-batch of the whole per-rank batch where it fits")


def refuse_graphs_across_microbatches(plan: Plan) -> None:
    """For a step that accumulates gradients in param.grad across micro-batches (single, DDP, ZeRO-0/1): CUDA graphs
    only with one micro-batch a step (GRAPHS_ACROSS_MICROBATCHES)."""
    run, n = plan.run, plan.grad_accum
    if run.compile and run.compile_mode == "reduce-overhead" and n > 1:
        raise ConfigError("compile_mode", "reduce-overhead", GRAPHS_ACROSS_MICROBATCHES.format(
            n=n, mb=plan.micro_batch_size, batch=plan.layout.per_rank_batch))


def compile_kwargs(run: BenchConfig) -> dict:
    """torch.compile keyword arguments of a run: its mode, unless the default."""
    return {} if run.compile_mode == "default" else {"mode": run.compile_mode}


def apply_compile(model: nn.Module, run: BenchConfig) -> dict:
    for block in model.blocks.values():
        block.compile(**compile_kwargs(run))
    return {"compile": "each transformer block (torch.compile)"}


def compile_counts() -> dict:
    """torch.compile's work in this process so far: graphs built (a recompile builds one more), graph breaks with the
    commonest reasons, Inductor's and AOTAutograd's on-disk cache hits and misses (a warm host reuses what an earlier
    run compiled), and the seconds compiling took by phase."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    breaks = counters["graph_break"]
    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(breaks.values()),
            "graph_break_reasons": [r for r, _ in breaks.most_common(3)],
            "cache": {k: counters[group][k] for group, keys in CACHES.items() for k in keys},
            "compile_s": {name: round(sum(compilation_time_metrics.get(key, ())), 3)
                          for name, key in COMPILE_PHASES.items()}}


def compile_record(run: BenchConfig, rank: int, graphs_after_warmup) -> dict | None:
    """The compile record of a run (None uncompiled); graphs compiled inside the timed window mean it timed
    compilation too."""
    if not run.compile:
        return None
    rec = {**compile_counts(), "graphs_after_warmup": graphs_after_warmup}
    if rec["graphs"] > graphs_after_warmup:
        log.warning("rank %d: torch.compile built %d graph(s) during the timed window (recompiles); "
                    "raise warmup_steps", rank, rec["graphs"] - graphs_after_warmup)
    return rec

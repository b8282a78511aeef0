"""``parallelize``: the torch-native steps applied in torchtitan's order over one model and one mesh.

float8 (precision=fp8: torchao, bench/parallel/float8.py) -> TP -> pipeline split -> activation
recomputation -> compile (per block) -> the data-parallel policy's wrap (bench/parallel/dp.py) -> compile
of the whole model, where one graph can hold it (no FSDP2 units, no DTensors, no stages: DDP's optimizer
splits the graph at its buckets).  float8 comes first, as in torchtitan: TP then shards the Float8Linear
layers with torchao's float8 styles.  Each step adds what it did to ``info`` (metrics.json's layout).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from bench.parallel.ac import apply_ac, apply_loss_chunks
from bench.parallel.compile import apply_compile, compile_kwargs
from bench.parallel.dp import DataParallel
from bench.parallel.float8 import apply_float8, converts, float8_tp
from bench.parallel.pp import split_stages
from bench.parallel.tp import apply_tp


@dataclass
class Parallelized:
    """This rank's part of the model after every step."""

    chunks: list[nn.Module]  # this rank's pipeline stages (the whole model without a pipeline)
    wrapped: list[nn.Module]  # the chunks as the step calls them (DDP-wrapped where the policy wraps)
    stage_ids: list[int]  # their global stage ids
    model: nn.Module  # wrapped[0], compiled whole where that applies
    info: dict = field(default_factory=dict)


def compiles_whole_model(plan, policy: DataParallel) -> bool:
    return bool(plan.run.compile) and not policy.shards and plan.tp == 1 and plan.pp == 1


def parallelize(model: nn.Module, plan, mesh, policy: DataParallel, pp_rank: int, device: torch.device,
                phase: Callable[[str], contextlib.AbstractContextManager]) -> Parallelized:
    """Apply the steps the layout needs (module docstring); ``phase`` names the timed parts of setup."""
    run, info = plan.run, {}
    if converts(run):
        with phase("float8 conversion"):
            info.update(apply_float8(model, plan))
    if plan.tp > 1:
        with phase("parallelize_module (TP)"):
            info.update(apply_tp(model, mesh["tp"], float8=float8_tp(plan)))
    stage_ids, chunks = split_stages(model, pp_rank, plan.pp, plan.layout.virtual_pipeline)
    whole = compiles_whole_model(plan, policy)
    with phase("recompute, loss chunks and compile wrappers"):
        for chunk in chunks:
            info.update(apply_ac(chunk, plan.layout))
        if plan.layout.loss_chunks > 1:  # no pipeline (bench/spec/layout_rules.py): the one chunk is the whole model
            info.update(apply_loss_chunks(chunks[0], plan.layout.loss_chunks))
        if run.compile and not whole:  # per block, after TP (DTensor dispatch traced away)
            for chunk in chunks:
                info.update(apply_compile(chunk, run))
            if plan.tp > 1:
                info["compile"] += ", after TP"
    with phase("wrap"):
        wrapped, wrap_info = policy.wrap(chunks, plan, mesh, device)
    info.update(wrap_info)
    top = wrapped[0]
    if whole:  # lazy: compiles in the first (warm-up) steps
        top = torch.compile(top, **compile_kwargs(run))
        info["compile"] = "the whole model" + (policy.whole_model_note() if plan.dp_size > 1 else "")
    return Parallelized(chunks=chunks, wrapped=wrapped, stage_ids=stage_ids, model=top, info=info)

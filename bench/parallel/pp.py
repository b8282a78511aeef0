"""Pipeline parallelism with ``torch.distributed.pipelining``.

A stage is bench's model class holding only the parts it owns (embeddings on the first stage,
final norm and head on the last, an even share of the blocks), so every later step (TP,
recomputation, compile, FSDP2 / DDP) applies to a stage as to the whole model.  With
``virtual_pipeline`` > 1 a rank holds the stages r, r + pp, ... (interleaved 1F1B).  The schedule
runs ``microbatches`` micro-batches per step and averages their gradients; a data-parallel wrapper
(DDP / FSDP2) around a stage is driven by the pipeline's own no-sync handling.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn as nn

from bench.spec.layout import local_stages, stage_layers
from bench.models.model import GPT, lm_loss


def stage_module(model: GPT, stage: int, n_stages: int) -> GPT:
    """Pipeline stage ``stage`` of ``n_stages``: the same class holding only its own parts (shared
    with ``model``, not copied)."""
    if n_stages == 1:
        return model
    m = GPT.__new__(GPT)
    nn.Module.__init__(m)
    m.__dict__.update({k: v for k, v in model.__dict__.items() if not k.startswith("_") and k != "training"})
    first, last = stage == 0, stage == n_stages - 1
    for name, child in model.named_children():
        if name == "blocks":
            m.blocks = nn.ModuleDict({str(i): model.blocks[str(i)]
                                      for i in stage_layers(stage, len(model.blocks), n_stages)})
        else:  # embeddings belong to the first stage, norm and head to the last
            keep = first if name in ("tok_emb", "pos_emb") else last if name in ("norm", "head") else True
            setattr(m, name, child if keep else None)
    return m


def split_stages(model: GPT, pp_rank: int, pp: int, virtual: int) -> tuple[list[int], list[GPT]]:
    """This rank's global stage ids and their modules."""
    ids = local_stages(pp_rank, pp, virtual)
    return ids, [stage_module(model, k, pp * virtual) for k in ids]


def build_schedule(stages: list[nn.Module], stage_ids: list[int], n_stages: int, schedule: str,
                   microbatches: int, device, group):
    """The torch.distributed.pipelining schedule over this rank's (wrapped) stage modules."""
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B)

    pstages = [PipelineStage(mod, k, n_stages, device, group=group) for mod, k in zip(stages, stage_ids)]
    if schedule == "gpipe":
        sched = ScheduleGPipe(pstages[0], microbatches, loss_fn=lm_loss)
    elif schedule == "1f1b":
        sched = Schedule1F1B(pstages[0], microbatches, loss_fn=lm_loss)
    else:
        sched = ScheduleInterleaved1F1B(pstages, microbatches, loss_fn=lm_loss)
    # return_outputs=False (newer torch) keeps the last stage from concatenating the logits
    kwargs = {"return_outputs": False} if "return_outputs" in inspect.signature(sched.step).parameters else {}
    return sched, kwargs


def run_schedule(sched, kwargs: dict, x: torch.Tensor, y: torch.Tensor, first: bool, last: bool):
    """One step of the pipeline: the first stage feeds x, the last computes the loss of y; returns
    the mean micro-batch loss on the last stage (None elsewhere)."""
    losses: list = []
    sched.step(*((x,) if first else ()), target=y if last else None, losses=losses if last else None, **kwargs)
    return torch.stack([l.detach().float() for l in losses]).mean() if last else None

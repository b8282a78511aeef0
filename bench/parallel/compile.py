"""torch.compile per transformer block (after TP and recomputation, before FSDP2 / DDP, as torchtitan):
a wrapper's hooks stay outside the graphs, and DTensor's dispatch is traced away."""
from __future__ import annotations

import torch.nn as nn

from bench.run.schema import BenchConfig


def compile_kwargs(run: BenchConfig) -> dict:
    """torch.compile keyword arguments of a run: its mode, unless the default."""
    return {} if run.compile_mode == "default" else {"mode": run.compile_mode}


def apply_compile(model: nn.Module, run: BenchConfig) -> dict:
    for block in model.blocks.values():
        block.compile(**compile_kwargs(run))
    return {"compile": "each transformer block (torch.compile)"}

"""torch.compile per transformer block (after TP and recomputation, before FSDP2 / DDP, as torchtitan):
a wrapper's hooks stay outside the graphs, and DTensor's dispatch is traced away."""
from __future__ import annotations

import torch.nn as nn


def compile_kwargs(cfg: dict) -> dict:
    """torch.compile keyword arguments of a run: its mode, unless the default."""
    return {} if cfg["compile_mode"] == "default" else {"mode": cfg["compile_mode"]}


def apply_compile(model: nn.Module, cfg: dict) -> dict:
    for block in model.blocks.values():
        block.compile(**compile_kwargs(cfg))
    return {"compile": "each transformer block (torch.compile)"}

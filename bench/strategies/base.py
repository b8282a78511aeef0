"""The strategy interface: what a strategy's class does (what it registers: bench/strategies/registry.py).

A strategy owns how the model is built, wrapped, fed and stepped, and nothing more: the worker
owns timing, synchronization, metrics and writing.  A strategy never times its steps; it only
names the phases of its setup (``setup_phase``), so start-up cost can be attributed.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

import torch

from bench.models.data import SyntheticStream
from bench.models.model import DTYPES
from bench.metrics.timing import phase
from bench.spec.schema import Plan


@dataclass
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str


@dataclass
class StepResult:
    loss: Optional[torch.Tensor]  # mean loss over this rank's share of the global batch, or None
    skipped: bool = False  # fp16: the optimizer step was skipped for an inf/nan gradient


class Precision:
    """Autocast over fp32 master weights (bf16, fp16) or plain fp32; fp16 adds dynamic loss
    scaling.  Shared by the strategies that run their own optimizer loop."""

    def __init__(self, precision: str, device: torch.device, autocast: bool = True, scaler=None):
        self.name = precision
        self.dtype = DTYPES[precision]
        self.device_type = device.type
        self.use_autocast = autocast and precision != "fp32"
        if scaler is None and precision == "fp16":
            scaler = torch.amp.GradScaler(device.type)
        self.scaler = scaler

    def autocast(self):
        if not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, clip: Optional[Callable[[], None]] = None) -> bool:
        """Clip (``clip()``, after unscaling), step and update the scale; True when the step was skipped."""
        if self.scaler is None:
            if clip is not None:
                clip()
            optimizer.step()
            return False
        if clip is not None:
            self.scaler.unscale_(optimizer)
            clip()
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() < before


class Strategy(ABC):
    name: ClassVar[str] = ""

    def __init__(self, plan: Plan, dist: DistContext):
        self.plan, self.dist = plan, dist
        self.setup_phases_s: dict[str, float] = {}  # metrics.json ranks[].setup_phases_s

    def setup_phase(self, name: str):
        """Time one named part of setup() (wall seconds on this rank, no device sync)."""
        return phase(self.setup_phases_s, name)

    def data_stream(self, dp_rank: int) -> SyntheticStream:
        """This rank's slices of the run's global batches (the one data stream of every strategy)."""
        p = self.plan
        return SyntheticStream(p.model, seed=p.run.seed, steps=p.run.steps, dp_rank=dp_rank,
                               dp_size=p.dp_size, device=self.dist.device)

    @abstractmethod
    def setup(self) -> None:
        """Build and wrap the model and optimizer; prepare this rank's data."""

    @abstractmethod
    def step(self, n: int) -> StepResult:
        """One optimizer step over global batch n (micro-batching included)."""

    def close(self) -> None:
        """Release what must go before the process group does (after the results are written)."""

    def tokens_this_rank(self) -> int:
        """Tokens this rank counts per optimizer step; the run's tokens are the sum over ranks.
        Default, the data-parallel rule: this rank's share of the global batch (model-parallel
        strategies override it: one replica for TP, the last stage for PP)."""
        return self.plan.micro_batch_size * self.plan.grad_accum * self.plan.model.seq_len

    def describe(self) -> dict:
        """The layout and library settings that actually ran (goes into metrics.json)."""
        return {}

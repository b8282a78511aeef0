"""The strategy interface and its registry.

A strategy owns how the model is built, wrapped, fed and stepped, and nothing more: the
worker owns timing, synchronization, metrics and writing.  A strategy never times its steps; it
only names the phases of its setup (``setup_phase``), so start-up cost can be attributed.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

import torch

from bench.config import Plan
from bench.metrics.timing import phase

REGISTRY: dict[str, type["Strategy"]] = {}


def register(name: str) -> Callable[[type["Strategy"]], type["Strategy"]]:
    def deco(cls: type["Strategy"]) -> type["Strategy"]:
        cls.name = name
        REGISTRY[name] = cls
        return cls
    return deco


def get_strategy(name: str) -> type["Strategy"]:
    import bench.strategies  # noqa: F401  (imports every strategy module, filling REGISTRY)
    return REGISTRY[name]


# What a sweep's fork server imports for every run (bench/launch.py): torch._dynamo, which
# torch.optim and DDP import at their first use (1.1 s of DDP's setup on the 2-core CPU machine).
# None of these, nor a strategy's own (Strategy.preload_modules), makes a CUDA call when imported,
# so each forked rank still starts CUDA itself.
SWEEP_PRELOAD = ("torch._dynamo",)


def sweep_preloads(strategy_cfg: dict) -> tuple[str, ...]:
    """What a sweep's fork server imports for a run of this strategy (the worker records which of
    them it found imported)."""
    return (*SWEEP_PRELOAD, *get_strategy(strategy_cfg["name"]).preload_modules(strategy_cfg))


def compile_kwargs(cfg: dict) -> dict:
    """torch.compile keyword arguments of a run: its mode, unless the default."""
    return {} if cfg["compile_mode"] == "default" else {"mode": cfg["compile_mode"]}


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

    def __init__(self, precision: str, device: torch.device):
        self.name = precision
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

    def autocast(self):
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, params, grad_clip: float) -> bool:
        """Clip (optionally), step and update the scale; returns True when the step was skipped."""
        if self.scaler is None:
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            optimizer.step()
            return False
        if grad_clip > 0:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() < before


class Strategy(ABC):
    name: ClassVar[str]

    def __init__(self, plan: Plan, dist: DistContext):
        self.plan, self.dist = plan, dist
        self.setup_phases_s: dict[str, float] = {}  # metrics.json ranks[].setup_phases_s

    def setup_phase(self, name: str):
        """Time one named part of setup() (wall seconds on this rank, no device sync)."""
        return phase(self.setup_phases_s, name)

    @classmethod
    def preload_modules(cls, strategy_cfg: dict) -> tuple[str, ...]:
        """Modules this strategy's ranks import at setup that make no CUDA call when imported:
        with start_method=forkserver the fork server imports them once (bench/launch.py), so the
        runs of a sweep do not each pay for them."""
        return ()

    @classmethod
    def process_env(cls, plan: Plan) -> dict[str, str]:
        """Environment variables the rank process needs before CUDA starts."""
        return {}

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
        return self.plan.micro_batch_size * self.plan.grad_accum * self.plan.model["seq_len"]

    def describe(self) -> dict:
        """The layout and library settings that actually ran (goes into metrics.json)."""
        return {}

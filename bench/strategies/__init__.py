"""Strategies, one module each; importing this package registers them all."""
from bench.strategies import ddp, single  # noqa: F401
from bench.strategies import zero, fsdp  # noqa: F401
from bench.strategies import megatron, torch_pp, torch_tp  # noqa: F401  (tp, pp, megatron; no megatron.core import)
from bench.strategies.base import REGISTRY, DistContext, StepResult, Strategy, get_strategy, register

__all__ = ["REGISTRY", "DistContext", "StepResult", "Strategy", "get_strategy", "register"]

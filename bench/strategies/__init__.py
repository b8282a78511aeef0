"""Strategies, one module each; importing this package registers them all."""
from bench.strategies import ddp, single  # noqa: F401
from bench.strategies import zero, fsdp  # noqa: F401
from bench.strategies import model_parallel  # noqa: F401  (tp, pp, megatron; imports no implementation)
from bench.strategies.base import REGISTRY, DistContext, StepResult, Strategy, get_strategy, register

__all__ = ["REGISTRY", "DistContext", "StepResult", "Strategy", "get_strategy", "register"]

"""Strategies, one module each; importing this package registers them all."""
from bench.strategies import ddp, single  # noqa: F401
from bench.strategies.base import REGISTRY, DistContext, StepResult, Strategy, get_strategy, register

__all__ = ["REGISTRY", "DistContext", "StepResult", "Strategy", "get_strategy", "register"]

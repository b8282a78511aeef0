"""The strategies bench knows: every other module of this package registers its own StrategySpec
(bench/strategies/base.py) when imported; this module imports them all, once, and answers by name.
Adding a strategy is adding its module: nothing here names one."""
from __future__ import annotations

import importlib
import pkgutil

from bench.strategies.base import REGISTRY, StrategySpec

_discovered = False

# What a sweep's fork server imports for every run (bench/launch/local.py): torch._dynamo, which
# torch.optim and DDP import at their first use (1.1 s of DDP's setup on the 2-core CPU machine).
# None of these, nor a strategy's own (StrategySpec.preload), makes a CUDA call when imported,
# so each forked rank still starts CUDA itself.
SWEEP_PRELOAD = ("torch._dynamo",)


def specs() -> dict[str, StrategySpec]:
    """Every registered strategy, by name (imports the strategy modules the first time)."""
    global _discovered
    if not _discovered:
        import bench.strategies as pkg

        for m in pkgutil.iter_modules(pkg.__path__):
            if m.name not in ("base", "registry"):
                importlib.import_module(f"bench.strategies.{m.name}")
        _discovered = True
    return REGISTRY


def get_spec(name: str) -> StrategySpec:
    return specs()[name]


def sweep_preloads(strategy_cfg: dict) -> tuple[str, ...]:
    """What a sweep's fork server imports for a run of this strategy (the worker records which of
    them it found imported)."""
    return (*SWEEP_PRELOAD, *get_spec(strategy_cfg["name"]).preload(strategy_cfg))

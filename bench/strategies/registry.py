"""The strategies bench knows, and the description each registers.

A strategy is one module in this package that registers one :class:`StrategySpec`: its config
schema (the only source of its defaults, with each knob's documentation and search candidates),
its validation rules, how it holds model states (the memory plan), its tuning profile, what the
fork server should preload, and its class (bench/strategies/base.py: the interface).  Nothing outside
the module names the strategy: bench.config, the memory plan, the run key and the knob search ask
this module, which imports every module of the package once (importing none of them itself, so that
what only needs the descriptions - validation, run keys, the analysis - stays light).  Adding a
strategy is adding its module: nothing here names one.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

from bench.schema import Plan

@dataclass(frozen=True)
class ModelStates:
    """How a strategy holds parameters, gradients and optimizer states (bench/memory_model.py).

    ``scheme``: bytes per parameter, a key of memory_model.BYTES_PER_PARAM; ``stage``: ZeRO stage
    (>= 1 optimizer / dp, >= 2 gradients / dp, 3 parameters / dp); the offloads move a part to the
    host; ``unsharded_params_live``: the gathered 16-bit parameters of the whole model stay alive
    from forward to backward (FSDP2 without resharding)."""

    scheme: str
    stage: int = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    offload_grads: bool = False
    host_fp32_grad_partition: bool = False
    unsharded_params_live: bool = False
    note: str = ""


def replicated_states(cfg: dict) -> ModelStates:
    """A torch optimizer over fp32 weights (autocast or not), replicated over data-parallel ranks."""
    return ModelStates("fp32", note="model states replicated over data-parallel ranks, torch AdamW over fp32 weights"
                       + (" (autocast)" if cfg["precision"] != "fp32" else ""))


@dataclass(frozen=True)
class StrategySpec:
    """Everything bench knows about one strategy (module docstring)."""

    name: str
    schema: type  # its config dataclass: every knob, its default, doc, choices and search candidates
    summary: str  # one line: what it is (README / docs table)
    implementation: Callable[[Plan], type]  # the Strategy subclass (bench/strategies/base.py) that runs a plan
    rules: Callable[[Plan], None] = lambda plan: None  # its own cross-field rules; raise ConfigError
    model_states: Callable[[dict], ModelStates] = replicated_states  # memory plan: how it holds model states
    # tuning profiles (tuning=best): {dotted key: (value, evidence[, unless(plan) -> reason or None])};
    # bench/tuning.py applies them
    profiles: dict[str, dict[Any, tuple]] = field(default_factory=dict)
    preload: Callable[[dict], tuple[str, ...]] = lambda strategy_cfg: ()  # fork-server imports (no CUDA calls)
    process_env: Callable[[Plan], dict[str, str]] = lambda plan: {}  # environment needed before CUDA starts
    devices: tuple[str, ...] = ("cpu", "cuda")


REGISTRY: dict[str, StrategySpec] = {}  # filled by each strategy module's register(); read via bench.strategies.registry


def register(spec: StrategySpec) -> StrategySpec:
    if spec.name in REGISTRY and REGISTRY[spec.name] is not spec:
        raise ValueError(f"strategy {spec.name!r} registered twice")
    REGISTRY[spec.name] = spec
    return spec

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
            if m.name not in ("base", "registry"):  # the interface, this module
                importlib.import_module(f"bench.strategies.{m.name}")
        _discovered = True
    return REGISTRY


def get_spec(name: str) -> StrategySpec:
    return specs()[name]


def sweep_preloads(strategy_cfg: dict) -> tuple[str, ...]:
    """What a sweep's fork server imports for a run of this strategy (the worker records which of
    them it found imported)."""
    return (*SWEEP_PRELOAD, *get_spec(strategy_cfg["name"]).preload(strategy_cfg))

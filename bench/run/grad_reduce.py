"""``grad_reduce=fp32 | 16bit``: one run-level choice of the precision gradients are summed in across data-parallel
ranks, set on each strategy's own knob (``StrategySpec.grad_reduce``): DDP's comm hook, FSDP2's and ZeRO's
reduce_dtype, Megatron's grad_reduce_in_fp32.

At their defaults the strategies differ: ZeRO sums in DeepSpeed's 16 bit (under its torch_autocast, the blocks'
Linear gradients), the others in fp32. On a slow link that alone can order them (bench/planner/reduction.py), so a
sweep or the planner given ``grad_reduce`` compares them at equal numerics. A shorthand, as ``zero_stage``: the
record keeps only the strategy knob it set, which says what ran.
"""
from __future__ import annotations

from typing import Any, Iterable

from bench.spec.schema import ConfigError, fields_of
from bench.strategies.registry import StrategySpec, specs


def knob_of(spec: StrategySpec, choice: str, precision: str) -> tuple[str, Any]:
    """(dotted strategy key, value) that gives ``choice`` under ``precision`` (auto reads as bf16: DDP's hook)."""
    key, value = spec.grad_reduce[choice]
    return key, value(precision) if callable(value) else value


def apply(c: dict, spec: StrategySpec, explicit: Iterable[str]) -> tuple[dict, tuple[str, ...], tuple]:
    """``c`` with grad_reduce moved onto the strategy's knob; ``explicit`` with that key (tuning=best leaves it);
    (key, value, choice) set, for :func:`explain`, or () with grad_reduce at its default.  A strategy that sums
    no gradients, or an explicit strategy knob that says otherwise, is an error naming both."""
    c, explicit = dict(c), tuple(explicit)
    choice = c.pop("grad_reduce", "default")
    if choice in (None, "default"):
        return c, explicit, ()
    if choice not in spec.grad_reduce:
        has = "|".join(n for n, sp in specs().items() if choice in sp.grad_reduce)
        raise ConfigError("grad_reduce", choice, f"strategy={spec.name} sums no gradients across ranks; it applies to "
                          f"strategy={has} (leave grad_reduce=default for {spec.name})")
    key, value = knob_of(spec, choice, c["precision"])
    leaf, s = key.split(".", 1)[1], c["strategy"]
    if s[leaf] != value and (key in explicit or s[leaf] != fields_of(spec.schema)[leaf].default):
        raise ConfigError(key, s[leaf], f"contradicts grad_reduce={choice}, which sets {key}={value}; set only one "
                          "of them")
    return {**c, "strategy": {**s, leaf: value}}, (*explicit, key), (key, value, choice)


def explain(e: ConfigError, applied: tuple) -> ConfigError:
    """A strategy rule's refusal of the knob grad_reduce set (``applied``), said as grad_reduce's: the user's key."""
    key, value, choice = applied
    return ConfigError("grad_reduce", choice, f"sets {key}={value} here, and {e.valid}")

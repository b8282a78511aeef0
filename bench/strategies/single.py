"""``single``: one device, plain PyTorch, fused AdamW: the baseline every strategy is compared with."""
from __future__ import annotations

from dataclasses import dataclass

from bench.spec.schema import ConfigError, Plan, StrategyConfig
from bench.strategies.registry import StrategySpec, register, torch_native_over
from bench.parallel.compile import refuse_graphs_across_microbatches


@dataclass
class SingleConfig(StrategyConfig):
    name: str = "single"


def rules(plan: Plan) -> None:
    if plan.world_size != 1:
        raise ConfigError("world_size", plan.world_size, "strategy=single runs on exactly 1 device; use world_size=1 "
                                                         "or a parallel strategy (e.g. strategy=ddp)")
    refuse_graphs_across_microbatches(plan)


# CUDA graphs of the compiled step: the launch cost a small step is bound by goes (CUDA only; skipped on CPU)
REDUCE_OVERHEAD = ("1 x H100, compiled: gpt2 119.5k -> 242.3k tokens/s, 300m 193.5k -> 197.4k "
                   "(results/2026-11-25-h100-search-1gpu); 1 x H200, gpt2 fp16 133.3k -> 217.2k, 300m "
                   "208.9k -> 210.2k (results/2026-11-25-h200-search-1gpu)")


SPEC = register(StrategySpec(
    name="single", schema=SingleConfig, summary="one device, plain PyTorch, fused AdamW: the baseline",
    implementation=torch_native_over("DataParallel"), rules=rules, baseline=True, float8=True, loss_chunks=True,
    profiles={"best": {
        "compile": (True, "300m bf16, one H200: 168k -> 204k tokens/s (results/2026-11-22-h200x2-foundation)"),
        "compile_mode": ("reduce-overhead", REDUCE_OVERHEAD),
    }},
))

"""``ddp``: torch DistributedDataParallel, one replica per rank, each rank on its slice of the global
batch; gradients all-reduced in buckets overlapped with backward."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bench.schema import ConfigError, Plan, StrategyConfig, fields_of, knob
from bench.strategies.registry import StrategySpec, register
from bench.strategies.single import REDUCE_OVERHEAD
from bench.parallel.dp import TorchDDP
from bench.strategies.torch_native import torch_native


@dataclass
class DDPConfig(StrategyConfig):
    """torch DistributedDataParallel knobs (defaults are torch's)."""

    name: str = "ddp"
    bucket_cap_mb: float = knob(25.0, "gradient bucket size (MB): larger = fewer all-reduces, later overlap",
                                tune=(25.0, 100.0))
    gradient_as_bucket_view: bool = knob(True, "gradients are views into the buckets (no copy)")
    static_graph: bool = knob(False, "DDP may cache the used-parameter set and bucket order after step 1")
    comm_hook: str = knob("none", "bf16_compress | fp16_compress: all-reduce gradients in 16 bit (half the bytes)",
                          choices=("none", "bf16_compress", "fp16_compress"))


def _several_ranks(plan: Plan) -> Optional[str]:
    if plan.world_size > 1:
        return ("measured on 1 rank only: at 2 ranks eager DDP ran at 80-84% of 2 x single, compiled DDP at 60.5% "
                "of 2 x compiled single (2 x H200, results/2026-11-23-h200x2-zero-fsdp-tp-pp)")
    return None


def rules(plan: Plan) -> None:
    s = plan.strategy
    if s["bucket_cap_mb"] <= 0:
        raise ConfigError("strategy.bucket_cap_mb", s["bucket_cap_mb"], "must be > 0")
    if plan.dp_size == 1:  # one replica: DDP wraps nothing and the step is single's, so its own knobs would not run
        common = fields_of(StrategyConfig)  # (micro_batch_size still accumulates)
        for name, f in fields_of(DDPConfig).items():
            if name not in common and s[name] != f.default:
                raise ConfigError(f"strategy.{name}", s[name], f"does nothing at world_size=1 (one replica: DDP "
                                  f"wraps nothing, the step is single's); use world_size > 1 or {f.default}")
    if s["comm_hook"] == "bf16_compress" and plan.device != "cuda":
        raise ConfigError("strategy.comm_hook", s["comm_hook"], "needs NCCL (a GPU); on CPU use none or fp16_compress")


SPEC = register(StrategySpec(
    name="ddp", schema=DDPConfig, summary="torch DistributedDataParallel: replicas, bucketed all-reduce",
    implementation=lambda plan: torch_native(TorchDDP()), rules=rules,
    profiles={"best": {
        # one rank is single's step: single's compiled CUDA-graph profile holds; on several ranks it does not
        "compile": (True, "1 x H100, 1 rank: gpt2 94.6k -> 156.4k tokens/s, 300m 153.1k -> 195.0k "
                          "(results/2026-11-25-h100-search-1gpu)", _several_ranks),
        "compile_mode": ("reduce-overhead", REDUCE_OVERHEAD, _several_ranks),
    }},
))

"""``megatron``: megatron-core, Megatron DDP by default, any tp x pp x dp layout (GPU only).

Its schema and rules are the tp x pp x dp family's (bench/strategies/model_parallel.py); implementation.py is
megatron-core as the family's ``strategy.impl=megatron`` (tp and pp use it too), registered when this package is
imported.  Importing megatron.core takes ~5 s: this package's __init__ only registers; strategy.py and model.py
import megatron.core, and are imported only when a run uses impl=megatron.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bench.spec.schema import Plan, knob
from bench.strategies.megatron.implementation import megatron_only
from bench.strategies.model_parallel import CUDA_GRAPHS_EVIDENCE, ModelParallelConfig, family_spec
from bench.strategies.registry import plain_label


@dataclass
class MegatronConfig(ModelParallelConfig):
    """The family's schema, megatron-core only (no ``choices``: the family's rule says what to use instead)."""

    impl: str = knob("megatron", "megatron-core only (GPU); torch-native TP / PP: strategy=tp or strategy=pp with "
                     "strategy.impl=torch")


def _one_dp_rank(plan: Plan) -> Optional[str]:
    """The distributed optimizer shards over data-parallel ranks: with one, it only adds its copies."""
    if plan.dp_size == 1:
        return ("data-parallel size 1: nothing to shard, and it measured slower (1 x H100, 300m 149.4k vs 154.6k "
                "tokens/s, gpt2 132.2k vs 143.1k without it; results/2026-11-25-h100-search-1gpu; 1 x H200, 300m "
                "163.8k vs 172.4k; results/2026-11-25-h200-search-1gpu)")
    return None


SPEC = family_spec("megatron", MegatronConfig, "megatron-core: DDP by default, any tp x pp x dp layout", {"best": {
    "strategy.cuda_graph": (True, CUDA_GRAPHS_EVIDENCE),
    "strategy.use_distributed_optimizer": (True, "2 x H200, 300m, with CUDA graphs: 84.4-88.8% of 2 x one GPU "
                                                 "against 79.0-80.4% in the same calls "
                                                 "(results/2026-11-23-h200x2-zero-grad-norm-fsdp)", _one_dp_rank),
}}, rules=megatron_only, label=plain_label)  # its implementation is fixed: the name says it

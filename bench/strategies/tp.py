"""``tp``: tensor parallelism (``strategy.tp``, default 2), megatron-core's (``strategy.impl=megatron``,
GPU only) or torch DTensor's (``impl=torch``, CPU too).  The family's schema, rules and torch-native
implementation: bench/strategies/model_parallel.py; megatron-core's: bench/strategies/megatron/implementation.py."""
from __future__ import annotations

from dataclasses import dataclass

from bench.strategies.model_parallel import CUDA_GRAPHS_EVIDENCE, ModelParallelConfig, family_spec


@dataclass
class TPConfig(ModelParallelConfig):
    name: str = "tp"
    tp: int = 2


SPEC = family_spec("tp", TPConfig, "tensor parallelism (strategy.tp, default 2): megatron-core or torch DTensor",
                   {"best": {"strategy.cuda_graph": (True, CUDA_GRAPHS_EVIDENCE)}}, float8=True)

"""``pp``: pipeline parallelism (``strategy.pp``, default 2; 4p micro-batches), megatron-core's
(``strategy.impl=megatron``, GPU only) or torch.distributed.pipelining's (``impl=torch``, CPU too).
The family's schema, rules and torch-native implementation: bench/strategies/model_parallel.py;
megatron-core's: bench/strategies/megatron/implementation.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.spec.schema import alias_default
from bench.strategies.model_parallel import CUDA_GRAPHS_EVIDENCE, ModelParallelConfig, family_spec


@dataclass
class PPConfig(ModelParallelConfig):
    name: str = "pp"
    pp: int = 2
    microbatches: Any = alias_default("microbatches", "4p")


SPEC = family_spec("pp", PPConfig, "pipeline parallelism (strategy.pp, default 2): megatron-core or "
                   "torch.distributed.pipelining", {"best": {"strategy.cuda_graph": (True, CUDA_GRAPHS_EVIDENCE)}},
                   float8=True)

"""The tp x pp x dp family: strategies ``tp``, ``pp`` and ``megatron``.

One layout (``tp x pp x dp = world_size``, bench/layout.py) and one schema; the registered
classes differ only in their config defaults and choose the implementation named by
``strategy.impl``: ``megatron`` (megatron-core, GPU only: bench/strategies/megatron/) or
``torch`` (DTensor tensor parallelism and ``torch.distributed.pipelining``: torch_pp.py).
Neither implementation is imported until a run needs it (megatron.core takes ~5 s to import).
"""
from __future__ import annotations

from bench.strategies.base import StepResult, Strategy, register

MEGATRON_MODULES = ("megatron.core.parallel_state", "megatron.core.distributed", "megatron.core.optimizer",
                    "megatron.core.pipeline_parallel", "megatron.core.tensor_parallel",
                    "megatron.core.transformer.module", "bench.strategies.megatron.strategy",
                    "bench.strategies.megatron.model")


class ModelParallel(Strategy):
    """The tp x pp x dp family: delegates to the implementation named by strategy.impl."""

    def __init__(self, plan, dist):
        super().__init__(plan, dist)
        if plan.strategy["impl"] == "megatron":
            from bench.strategies.megatron.strategy import MegatronModelParallel as impl
        else:
            from bench.strategies.torch_pp import TorchModelParallel as impl
        self.impl = impl(plan, dist)
        self.setup_phases_s = self.impl.setup_phases_s  # the implementation's named setup parts

    @classmethod
    def preload_modules(cls, strategy_cfg: dict) -> tuple[str, ...]:
        # what MegatronModelParallel.setup imports (~5 s); none of it touches CUDA at import
        return MEGATRON_MODULES if strategy_cfg["impl"] == "megatron" else ()

    @classmethod
    def process_env(cls, plan) -> dict:
        """Environment this run's worker processes need before CUDA is initialised (for the
        worker to apply before torch.cuda.set_device): Megatron TP needs one CUDA connection."""
        if plan.strategy["impl"] == "megatron" and plan.tp > 1:
            return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        return {}

    def setup(self) -> None:
        self.impl.setup()

    def step(self, n: int) -> StepResult:
        return self.impl.step(n)

    def close(self) -> None:
        self.impl.close()

    def tokens_this_rank(self) -> int:
        return self.impl.tokens_this_rank()

    def describe(self) -> dict:
        return {"strategy": self.name, **self.impl.describe()}


@register("tp")
class TensorParallel(ModelParallel):
    """Tensor parallelism (strategy.tp > 1 by default); combines with pp and dp."""


@register("pp")
class PipelineParallel(ModelParallel):
    """Pipeline parallelism (strategy.pp > 1 by default); combines with tp and dp."""


@register("megatron")
class Megatron(ModelParallel):
    """megatron-core: DDP by default (tp = pp = 1), any tp x pp x dp layout."""

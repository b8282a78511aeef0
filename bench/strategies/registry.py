"""The strategies bench knows, and the description each registers.

A strategy is one module in this package that registers one :class:`StrategySpec`: its config
schema (the only source of its defaults, with each knob's documentation and search candidates),
its validation rules, how it holds model states (the memory plan), what a step moves between devices
(the throughput prediction), its tuning profile, what the fork server should preload, and its class
(bench/strategies/base.py: the interface).  Nothing outside
the module names the strategy: bench.run.config, the memory plan, the run key and the knob search ask
this module, which imports every strategy module of the package once (importing none of them itself), and not the
implementations a rank builds (``_REGISTER_NOTHING``): what only needs the descriptions - validation, run keys, the
planner, the analysis - never imports torch.  Adding a
strategy is adding its module: nothing here names one.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from bench.spec.schema import BenchConfig, Plan

@dataclass(frozen=True)
class Scheme:
    """Bytes per parameter of a way of holding model states (params, grads, optimizer), declared by the strategy
    that holds them so the memory plan only adds up; ``name`` is what the plan records."""

    name: str
    params: int
    grads: int
    optimizer: int

    @property
    def bytes(self) -> tuple[int, int, int]:
        return self.params, self.grads, self.optimizer


# the ZeRO paper's schemes (Rajbhandari et al. 2020) more than one strategy holds; one strategy's own lives with it
MIXED = Scheme("mixed", 2, 2, 12)  # 16-bit params and grads, fp32 master + Adam m, v
FP32 = Scheme("fp32", 4, 4, 8)  # fp32 weights (fp32 runs, autocast): Adam m, v
AUTOCAST_COPY = Scheme("autocast_copy", 4, 4, 12)  # + an optimizer's own fp32 copy of its partition


@dataclass(frozen=True)
class ModelStates:
    """How a strategy holds parameters, gradients, optimizer states and activations (bench/plan/memory_model.py).

    ``scheme``: bytes per parameter (:class:`Scheme`); ``stage``: ZeRO stage
    (>= 1 optimizer / dp, >= 2 gradients / dp, 3 parameters / dp); the offloads move a part to the
    host; ``unsharded_params_live``: the gathered parameters of the whole model stay alive
    from forward to backward (FSDP2 without resharding; 16-bit, the blocks' matmul weights 8-bit under
    fp8's float8 all-gather); ``sixteen_bit_weights``: under bf16 / fp16
    the forward runs on 16-bit weights (activations and norm inputs 16-bit, no per-consumer autocast
    casts); ``tp_splits_vocab``: the embedding and output layer are split over tp (so are the
    logits); ``grads_live``: the gradient buffers stay allocated through the forward, not only from
    the backward on; ``loss_bytes_per_logit``: what the loss holds per logit element when its backward
    runs (torch's cross entropy in fp32: the log-softmax output, its gradient and the fp32 logits' gradient,
    4 B each); ``late_grad_hooks``: the gradient hooks, and the backward buffers they allocate, run after the
    whole backward graph (one compiled graph for the model): beside all gradients, not beside the activations;
    ``sequence_parallel``: the norms' and the projections' inputs are split over tp too (Megatron's sequence
    parallelism: each rank keeps its slice of the sequence and gathers the rest again in backward);
    ``shared_input_casts``: under autocast the attention's and the MLP's inputs are cast to 16 bit once for all
    their projections (torch-native TP's pre-hook), not once per projection; ``accum_grad_bytes``: bytes per
    parameter of the unsharded gradients kept between gradient-accumulation micro-batches instead of the sharded
    ones (FSDP2 with gradient sync off but on the last micro-batch: every parameter's gradient, upcast to the
    reduce dtype); ``extra_communicators``: NCCL communicators the implementation creates beyond one per layout
    dimension (bench/plan/memory_margins.py); ``cuda_graph_pool``: the step is captured in a CUDA graph whose private
    pool holds the captured step's activations and temporaries beside the eager steps' cached blocks;
    ``extra_saved_per_token``: elements a transformer layer of this implementation keeps for its backward per token
    beyond what bench's own model's layer keeps (split over tp; the activation dtype)."""

    scheme: Scheme
    stage: int = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    offload_grads: bool = False
    host_fp32_grad_partition: bool = False
    unsharded_params_live: bool = False
    sixteen_bit_weights: bool = False
    tp_splits_vocab: bool = False
    grads_live: bool = False
    loss_bytes_per_logit: int = 12
    late_grad_hooks: bool = False
    sequence_parallel: bool = False
    shared_input_casts: bool = False
    accum_grad_bytes: int = 0
    extra_communicators: int = 0
    cuda_graph_pool: bool = False
    extra_saved_per_token: float = 0.0
    note: str = ""


def replicated_states(run: BenchConfig) -> ModelStates:
    """A torch optimizer over fp32 weights (autocast or not), replicated over data-parallel ranks."""
    return ModelStates(FP32, note="model states replicated over data-parallel ranks, torch AdamW over fp32 weights"
                       + (" (autocast)" if run.precision != "fp32" else ""))


def torch_native_over(policy: str) -> Callable[[Plan], Callable]:
    """A torch-native strategy's implementation: bench/strategies/torch_native.py's steps over the data-parallel policy
    ``policy`` names (bench/parallel/dp.py), both imported where a rank builds it: the modules that register, which
    validation, the planner and the analysis read, never import torch."""
    def implementation(plan: Plan) -> Callable:
        from bench.parallel import dp
        from bench.strategies.torch_native import torch_native

        return torch_native(getattr(dp, policy)())
    return implementation


def no_buffers(plan: Plan, params: float, per_block: float) -> tuple[float, str]:
    """Communication / gather buffers beside the model states: none (torch DDP's buckets are the gradients)."""
    return 0.0, ""


def no_traffic(plan: Plan, params: float) -> dict[str, float]:
    """What a step moves between devices and adds on the host beyond the model's own kernels: nothing (one device)."""
    return {}


def no_phase_buffers(plan: Plan, params: float, per_block: float) -> tuple[dict[str, float], str]:
    """Buffers alive in part of a step only (StrategySpec.phase_buffers): none."""
    return {}, ""


def knob_text(v: Any) -> str:
    """A knob's value as a user types it (a table cell may hold 2.0 for 2)."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def plain_label(name: str, values: dict) -> list[str]:
    """The analysis's name for a run of this strategy: its name (the knobs that vary are appended generically)."""
    return [name]


@dataclass(frozen=True)
class StrategySpec:
    """Everything bench knows about one strategy (module docstring)."""

    name: str
    schema: type  # its config dataclass: every knob, its default, doc, choices and search candidates
    summary: str  # one line: what it is (README / docs table)
    # what runs a plan: (plan, DistContext) -> a Strategy (bench/strategies/base.py), a class or a factory
    implementation: Callable[[Plan], Callable]
    rules: Callable[[Plan], None] = lambda plan: None  # its own cross-field rules; raise ConfigError
    # memory plan: how it holds model states, given the typed run description (plan.run)
    model_states: Callable[[BenchConfig], ModelStates] = replicated_states
    buffers: Callable[[Plan, float, float], tuple[float, str]] = no_buffers  # memory plan: (bytes, what they are)
    # memory plan: buffers alive in part of a step only, by phase: "pass" from the forward to the end of the
    # backward (ZeRO-3's gathered parameters), "backward" from a backward's first gradient to its end (ZeRO's reduce
    # buckets: beside the activations, not beside the loss' logits buffers), "reduce" once the backward of the rank's
    # last "reduce_blocks" blocks has run (FSDP2's reduce-scatter input: beside the other blocks' activations, not
    # those blocks' nor the logits' buffers), "end" at the backward's end (beside the gradients, no activation: FSDP2's
    # root reduce-scatter), "step" the optimizer step's temporaries
    phase_buffers: Callable[[Plan, float, float], tuple[dict[str, float], str]] = no_phase_buffers
    # memory plan: why a plan that fits is still "tight" for this strategy (measured: where its allocator slows down
    # before it runs out), given the planned allocated bytes and the device's GiB; None: no such limit
    crowded: Callable[[Plan, float, Optional[float]], Optional[str]] = lambda plan, allocated, mem_gib: None
    # the throughput prediction (bench/plan/predict.py): (plan, parameters on the rank) -> per step, bytes sent by
    # kind and host work (keys: bench/costs/traffic.py)
    traffic: Callable[[Plan, float], dict[str, float]] = no_traffic
    # the analysis: the words naming a run of it, given its varying knob values ({knob: value}; the layout's
    # tp / pp and recompute are added by the analysis), and the knob whose values its variants figure compares
    label: Callable[[str, dict], list[str]] = plain_label
    variants_figure: Optional[tuple[str, str]] = None  # (knob, figure title)
    baseline: bool = False  # the single-device baseline every other strategy is compared with
    # tuning profiles (tuning=best): {dotted key: (value, evidence[, unless(plan) -> reason or None])};
    # bench/run/tuning_profiles.py applies them
    profiles: dict[str, dict[Any, tuple]] = field(default_factory=dict)
    # the knob search (bench/sweep/search.py): {dotted key: values} of keys that are part of the strategy's identity,
    # not knobs (each value a strategy of its own in the analysis and the store of measured bests: ZeRO's stages); a
    # search base that does not set the key is searched once per value, each its own base with its own winner
    search_bases: dict[str, tuple] = field(default_factory=dict)
    # fork-server imports (no CUDA calls), given the strategy section: a Plan's typed one (bench/launch/worker.py) or a
    # sweep's plain dict (bench/sweep/jobs.py): read it through strategy_knob
    preload: Callable[[Any], tuple[str, ...]] = lambda strategy: ()
    process_env: Callable[[Plan], dict[str, str]] = lambda plan: {}  # environment needed before CUDA starts
    devices: tuple[str, ...] = ("cpu", "cuda")
    # precision=fp8 runs: torchao's float8 training composes with its implementation (bench/parallel/float8.py)
    float8: bool = False
    # grad_reduce=fp32 | 16bit (bench/run/grad_reduce.py): {choice: (knob, value)}, the knob and value with which it
    # sums gradients across data-parallel ranks in that precision (a value may be a function of the run's precision);
    # empty: it reduces none.  Not searched, as it changes numerics; the planner names the 16-bit one where it would
    # pay (bench/planner/reduction.py)
    grad_reduce: dict[str, tuple[str, Any]] = field(default_factory=dict)
    # loss_chunks > 1 runs: its step takes the loss from bench's model (bench/models/model.py model_loss, the head's
    # chunked loss), not from a loss of its own (an implementation of a family may still refuse the knob)
    loss_chunks: bool = False


REGISTRY: dict[str, StrategySpec] = {}  # filled by each strategy module's register(); read via bench.strategies.registry


def register(spec: StrategySpec) -> StrategySpec:
    if spec.name in REGISTRY and REGISTRY[spec.name] is not spec:
        raise ValueError(f"strategy {spec.name!r} registered twice")
    REGISTRY[spec.name] = spec
    return spec

_discovered = False
# the package's modules that register no strategy: this one, the interface, and the implementations a rank imports
# (torch, DeepSpeed), which the strategy modules import only where a rank builds one: validation, the planner and the
# analysis never load torch (1.9 CPU-seconds of every command on the CPU machine)
_REGISTER_NOTHING = ("registry", "base", "torch_native", "zero_engine")

# What a sweep's fork server imports for every run (bench/launch/local.py): torch._dynamo, which
# torch.optim and DDP import at their first use (1.1 s of DDP's setup on the 2-core CPU machine).
# None of these, nor a strategy's own (StrategySpec.preload), starts CUDA when imported (DeepSpeed's device
# count reads NVML), so each forked rank still starts CUDA itself.
SWEEP_PRELOAD = ("torch._dynamo",)
# What a compiled run's first torch.compile imports (TorchInductor's compiler: 1.6 s on the CPU machine; most of the
# 4.1 s an FSDP2 run's compile-wrapper phase took on one H200 on a host that had compiled its graphs before,
# results/2026-12-02-h200x1-megatron-memory), for a sweep with a compiled run.
COMPILE_PRELOAD = ("torch._inductor.compile_fx",)


def specs() -> dict[str, StrategySpec]:
    """Every registered strategy, by name (imports the strategy modules the first time)."""
    global _discovered
    if not _discovered:
        import bench.strategies as pkg

        for m in pkgutil.iter_modules(pkg.__path__):
            if m.name not in _REGISTER_NOTHING:
                importlib.import_module(f"bench.strategies.{m.name}")
        _discovered = True
    return REGISTRY


def get_spec(name: str) -> StrategySpec:
    return specs()[name]


def baseline_name() -> str:
    """The strategy every other one is compared with (the one spec that says ``baseline=True``)."""
    (name,) = [n for n, s in specs().items() if s.baseline]
    return name


def strategy_knob(strategy: Any, key: str, default: Any = None) -> Any:
    """One knob of a strategy section given typed (a Plan's: an attribute) or as the plain dict a sweep holds
    before validation (bench/sweep/jobs.py declare_preloads); ``default`` where it is not set."""
    if isinstance(strategy, dict):
        return strategy.get(key, default)
    return getattr(strategy, key, default)


def grad_reduce_of(plan: Plan, params: Optional[float] = None) -> Optional[str]:
    """What the plan's data-parallel reduction sums gradients in (fp32, 16bit, mixed; None: no reduction), from its
    strategy's traffic (``grad_elem``) over ``params`` on the rank (the memory plan's, else the model's)."""
    from bench.costs.traffic import reduced_in
    from bench.metrics.flops import total_params

    if params is None:
        params = (plan.memory or {}).get("parameters_on_rank") or total_params(plan.model)
    return reduced_in(get_spec(plan.strategy.name).traffic(plan, float(params)).get("grad_elem", 0))


def sweep_preloads(run: BenchConfig) -> tuple[str, ...]:
    """What a sweep's fork server imports for this run (the worker records which of them it found imported):
    every run's, a compiled run's, its strategy's."""
    return (*SWEEP_PRELOAD, *(COMPILE_PRELOAD if run.compile else ()),
            *get_spec(run.strategy.name).preload(run.strategy))

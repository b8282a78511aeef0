"""The tp x pp x dp family's shared parts: one schema, the rules of its knobs, and its implementations' interface.
The strategies ``tp`` (tp.py), ``pp`` (pp.py) and ``megatron`` (megatron/__init__.py) each register
themselves through ``family_spec``; they differ in defaults and tuning profiles.

``strategy.impl`` picks the implementation, an :class:`Implementation` registered under that name: ``torch``
(here: DTensor tensor parallelism and torch.distributed.pipelining, bench/parallel, through
bench/strategies/torch_native.py; runs on CPU too; its data-parallel replicas reduce through torch DDP) or
``megatron`` (megatron-core, GPU only: bench/strategies/megatron/implementation.py, which registers itself when
the registry imports that package; megatron.core itself is imported only when a run needs it: ~5 s).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from bench.spec.layout_rules import build as build_layout, check_torch_native
from bench.spec.schema import CUDA_GRAPH_CAPTURE_STEP, BenchConfig, ConfigError, LayoutKnobs, Plan, fields_of, knob
from bench.strategies.ddp import bucket_bytes
from bench.strategies.registry import FP32, ModelStates, StrategySpec, register, specs, torch_native_over
from bench.costs.traffic import all_reduce, buckets, merge, param_tensors, pp_p2p, torch_native_hooks, torch_tp


@dataclass
class ModelParallelConfig(LayoutKnobs):
    """One schema for the tp x pp x dp family (the layout knobs: bench/spec/schema.py).  dp = world_size / (tp * pp)."""

    name: str = "megatron"
    impl: str = knob("megatron", "megatron (megatron-core, GPU only) | torch (DTensor TP + torch.distributed."
                     "pipelining; runs on CPU too)", choices=("megatron", "torch"))
    sequence_parallel: bool = knob(False, "Megatron sequence parallelism: norms / dropout split over tp (needs tp > 1)")
    overlap_grad_reduce: bool = knob(True, "Megatron DDP: gradient reduction overlapped with backward")
    use_distributed_optimizer: bool = knob(False, "optimizer states sharded over dp, gradients reduce-scattered, "
                                           "parameters all-gathered after the step (ZeRO-1)", tune=(False, True))
    overlap_param_gather: bool = knob(False, "with the distributed optimizer: parameter all-gather overlapped with "
                                      "the next forward")
    bucket_size: Optional[int] = knob(None, "parameters per gradient bucket; null = Megatron's default")
    grad_reduce_in_fp32: bool = knob(True, "gradients reduced in fp32 (main grads)")
    fused_adam: bool = knob(True, "torch AdamW's fused kernel for megatron-core's fallback optimizer (no TE / Apex)")
    cuda_graph: bool = knob(False, "capture each step's forward + backward (all micro-batches, pipeline sends and "
                            "receives, the gradient reduction) as one CUDA graph, replayed from step "
                            f"{CUDA_GRAPH_CAPTURE_STEP} on", tune=(False, True))
    batch_p2p_sync: bool = knob(True, "a device sync after each batched pipeline send / receive (Megatron's "
                                "default; cuda_graph=true turns it off)")
    spec: str = knob("auto", "Megatron layer spec: auto (te if transformer_engine imports, else sdpa) | sdpa | "
                     "local | te", choices=("auto", "sdpa", "local", "te"))
    init: str = knob("bench", "bench: copy bench's initial weights (= strategy=single's) | megatron: Megatron's init",
                     choices=("bench", "megatron"))


@dataclass(frozen=True)
class Implementation:
    """What differs between the family's implementations (``strategy.impl``): the family's spec reads the knob
    once (``implementation_of``) and asks the object, so no code outside an implementation tests which one runs."""

    name: str  # the strategy.impl value
    runner: Callable[[Plan], Callable]  # the Strategy class (or torch-native factory) that runs a plan
    rules: Callable[[Plan], None]  # what it can run; before the family's knob rules
    model_states: Callable[[BenchConfig], ModelStates]
    buffers: Callable[[Plan, float, float], tuple[float, str]]
    traffic: Callable[[Plan, float], dict[str, float]]
    env: Callable[[Plan], dict[str, str]] = lambda plan: {}  # process environment set before CUDA starts
    preload: tuple[str, ...] = ()  # fork-server imports (no CUDA calls)
    label: tuple[str, ...] = ()  # the words naming it in the analysis (none: the family's default)
    # the family's knobs it does not implement: {config key: why, and what to use instead ({name}: the strategy)}
    refuses: dict[str, str] = field(default_factory=dict)


IMPLEMENTATIONS: dict[str, Implementation] = {}


def register_implementation(impl: Implementation) -> Implementation:
    if IMPLEMENTATIONS.setdefault(impl.name, impl) is not impl:
        raise ValueError(f"implementation {impl.name!r} registered twice")
    return impl


def implementation_of(strategy: ModelParallelConfig) -> Implementation:
    """The one place the family reads strategy.impl (an implementation registers itself when its module is
    imported; the registry imports every strategy module)."""
    if strategy.impl not in IMPLEMENTATIONS:
        specs()
    return IMPLEMENTATIONS[strategy.impl]


def family_rules(plan: Plan, own: Optional[Callable[[Plan], None]] = None) -> None:
    """The strategy's own rule, which implementation can run this plan, then the knobs' rules."""
    if own is not None:
        own(plan)
    impl = implementation_of(plan.strategy)
    impl.rules(plan)
    _knob_rules(plan, impl)
    if plan.strategy.cuda_graph:
        _cuda_graph_rules(plan, impl)


def _refuse(plan: Plan, impl: Implementation, key: str, value: Any) -> None:
    if key in impl.refuses:
        raise ConfigError(key, value, impl.refuses[key].format(name=plan.strategy.name))


def _knob_rules(plan: Plan, impl: Implementation) -> None:
    s, m, c, tp = plan.strategy, plan.model, plan.run, plan.tp
    if s.sequence_parallel:
        if tp == 1:
            raise ConfigError("strategy.sequence_parallel", True, "needs strategy.tp > 1")
        _refuse(plan, impl, "strategy.sequence_parallel", True)
        if m.seq_len % tp:
            raise ConfigError("strategy.sequence_parallel", True, f"needs model.seq_len={m.seq_len} divisible "
                              f"by strategy.tp={tp}")
    if c.compile:
        _refuse(plan, impl, "compile", True)
    if plan.layout.cp > 1:
        _refuse(plan, impl, "strategy.cp", plan.layout.cp)
    if plan.layout.loss_chunks > 1:
        _refuse(plan, impl, "loss_chunks", plan.layout.loss_chunks)
    if s.bucket_size is not None and s.bucket_size <= 0:
        raise ConfigError("strategy.bucket_size", s.bucket_size, "must be a positive number of parameters, or null")
    if s.overlap_param_gather and not s.use_distributed_optimizer:
        raise ConfigError("strategy.overlap_param_gather", True, "needs strategy.use_distributed_optimizer=true")
    for name, f in fields_of(ModelParallelConfig).items():  # a knob the implementation does not read, set: refused
        if getattr(s, name) != f.default:
            _refuse(plan, impl, f"strategy.{name}", getattr(s, name))


def _cuda_graph_rules(plan: Plan, impl: Implementation) -> None:
    s, c = plan.strategy, plan.run
    _refuse(plan, impl, "strategy.cuda_graph", True)
    if s.overlap_param_gather:
        raise ConfigError("strategy.cuda_graph", True, "cannot capture strategy.overlap_param_gather's "
                          "forward hooks; set overlap_param_gather=false")
    if c.precision == "fp16":
        raise ConfigError("strategy.cuda_graph", True, "with precision=fp16: the dynamic loss scale is a new "
                          "tensor after each change, which a captured graph would not see; use bf16 or fp32")
    if c.warmup_steps <= CUDA_GRAPH_CAPTURE_STEP:
        raise ConfigError("warmup_steps", c.warmup_steps, f"must be > {CUDA_GRAPH_CAPTURE_STEP} with "
                          f"strategy.cuda_graph=true: steps 0-{CUDA_GRAPH_CAPTURE_STEP - 1} run eagerly and step "
                          f"{CUDA_GRAPH_CAPTURE_STEP} is captured, so no timed step includes the capture")


def family_label(name: str, v: dict) -> list[str]:
    """The strategy's name and its implementation's words (a value no implementation has: named as it is)."""
    impl = v.get("impl")
    if impl is None:
        return [name]
    if impl not in IMPLEMENTATIONS:
        specs()
    known = IMPLEMENTATIONS.get(impl)
    return [name, *(known.label if known else [f"impl={impl}"])]


def family_spec(name: str, schema: type, summary: str, profiles: dict, float8: bool = False,
                rules: Optional[Callable[[Plan], None]] = None,
                label: Callable[[str, dict], list[str]] = family_label) -> StrategySpec:
    """Register one strategy of the family (its own module calls this: tp.py, pp.py, megatron/); ``float8``:
    precision=fp8 runs with strategy.impl=torch (torchao's float8 before TP / the pipeline split); ``rules``: the
    strategy's own, checked first."""
    return register(StrategySpec(
        name=name, schema=schema, summary=summary, float8=float8, profiles=profiles, label=label, loss_chunks=True,
        # megatron-core's (impl=torch refuses 16 bit)
        grad_reduce={"fp32": ("strategy.grad_reduce_in_fp32", True), "16bit": ("strategy.grad_reduce_in_fp32", False)},
        implementation=lambda plan: implementation_of(plan.strategy).runner(plan),
        rules=lambda plan: family_rules(plan, rules),
        model_states=lambda run: implementation_of(run.strategy).model_states(run),
        buffers=lambda plan, psi, per_block: implementation_of(plan.strategy).buffers(plan, psi, per_block),
        traffic=lambda plan, params: implementation_of(plan.strategy).traffic(plan, params),
        process_env=lambda plan: implementation_of(plan.strategy).env(plan),
        preload=lambda s: implementation_of(s).preload))


# ------------------------------------------------------------------------------ torch-native
def _torch_rules(plan: Plan) -> None:
    if plan.run.precision == "fp16":
        raise ConfigError("precision", "fp16", "is not supported with strategy.impl=torch (no loss scaling "
                          "across shards and stages); use precision=bf16, or strategy.impl=megatron")
    check_torch_native(plan, shards_dtensors=False)


def _torch_model_states(run: BenchConfig) -> ModelStates:
    """Replicated fp32 weights, torch AdamW; torch TP casts the attention's and MLP's inputs once
    (bench/parallel/tp.py)."""
    lay = build_layout(run)
    return ModelStates(FP32, shared_input_casts=lay.tp > 1, note=f"torch tp={lay.tp} pp={lay.pp}: fp32 weights, "
                       "torch AdamW")


def _torch_buffers(plan: Plan, psi: float, per_block: float) -> tuple[float, str]:
    """Replicas (dp > 1) reduce through torch DDP at its defaults (bench/parallel/dp.py): buckets beside the
    gradients (no gradient_as_bucket_view), rebuilt at step 2 except under a pipeline (find_unused_parameters)."""
    return bucket_bytes(plan, psi, views=False, rebuilds=plan.pp == 1)


def _torch_traffic(plan: Plan, params: float) -> dict[str, float]:
    """tp's activation all-reduces and pp's sends (bench/costs/traffic.py), then torch DDP's fp32 all-reduce."""
    dp, grads = plan.dp_size, 4 * params
    own = {"grad_reduce": all_reduce(grads, dp), "collectives": buckets(grads, 25 * 2**20) if dp > 1 else 0,
           "hooks": param_tensors(plan) if plan.tp > 1 else 0, **({"grad_elem": 4} if dp > 1 else {})}
    return merge(own, torch_tp(plan), pp_p2p(plan), torch_native_hooks(plan))


# the family's knobs only megatron-core reads (its DDP, optimizer and layer spec): the torch implementation refuses a
# value other than the default, which is what it runs
MEGATRON_ONLY = ("overlap_grad_reduce", "use_distributed_optimizer", "overlap_param_gather", "bucket_size",
                 "grad_reduce_in_fp32", "fused_adam", "batch_p2p_sync", "spec", "init")
TORCH_NATIVE = register_implementation(Implementation(
    name="torch", runner=torch_native_over("TorchDDP"),  # replicas (tp = 1) reduce through torch DDP
    rules=_torch_rules, model_states=_torch_model_states, buffers=_torch_buffers, traffic=_torch_traffic,
    refuses={"strategy.sequence_parallel": "is implemented for strategy.impl=megatron only; use "
                                           "sequence_parallel=false with impl=torch",
             "strategy.cuda_graph": "is implemented for strategy.impl=megatron only; with impl=torch use "
                                    "compile=true",
             "strategy.cp": "is implemented for strategy=fsdp (FSDP2 shards and averages over dp x cp; "
                            "strategy={name} with impl=torch reduces through DDP over dp alone); use strategy=fsdp "
                            "strategy.cp=...",
             **{f"strategy.{name}": f"is read by megatron-core only (its DDP, optimizer or layer spec): strategy.impl="
                                    f"torch would run without it; leave it at {f.default}, or use strategy.impl=megatron"
                for name, f in fields_of(ModelParallelConfig).items() if name in MEGATRON_ONLY}}))


CUDA_GRAPHS_EVIDENCE = ("2 x H200, 300m: Megatron DDP=2 57% -> 79-85% of 2 x one GPU, TP=2 48.5% -> 61-64%, PP=2 m=4p "
                        "18% -> 65-68% (results/2026-11-22-h200x2-graphs-timing-teardown, "
                        "results/2026-11-23-h200x2-zero-fsdp-tp-pp)")

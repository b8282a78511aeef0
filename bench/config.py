"""Typed configuration and the one place where a configuration is checked.

Hydra composes ``conf/`` over these dataclasses (registered in the ConfigStore), so an
unknown key or a wrong type fails at composition.  ``validate`` then applies every
cross-field rule and returns a :class:`Plan`: the resolved, checked description of the
run that the launcher and the workers use.  Errors name the key, the value and what
would be valid, and are raised before any process is spawned.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

PRECISIONS = ("fp32", "bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")  # torch.compile(mode=...)
DEVICES = ("auto", "cuda", "cpu")
START_METHODS = ("forkserver", "spawn")
CPU_AFFINITIES = ("none", "split")
FAULT_KINDS = ("none", "raise", "oom", "hang", "crash_at_exit", "hang_at_exit", "stuck_at_exit")
DDP_COMM_HOOKS = ("none", "bf16_compress", "fp16_compress")
STEP_TIMINGS = ("events", "sync")


class ConfigError(ValueError):
    """A configuration that cannot run; the message names key, value and valid choices."""

    def __init__(self, key: str, value: Any, valid: str):
        self.key, self.value, self.valid = key, value, valid
        super().__init__(f"invalid config: {key}={value!r}: {valid}")


# --------------------------------------------------------------------------- schema
@dataclass
class ModelConfig:
    """The GPT every strategy trains; batch and sequence belong to the model preset."""

    name: str = MISSING
    d_model: int = MISSING
    n_heads: int = MISSING
    n_layers: int = MISSING
    d_ff: int = MISSING
    vocab_size: int = 8000
    seq_len: int = MISSING
    global_batch: int = MISSING  # sequences per optimizer step, over all ranks


@dataclass
class StrategyConfig:
    """Fields every strategy has. ``micro_batch_size`` is per data-parallel rank;
    null means one micro-batch per step (no gradient accumulation)."""

    name: str = MISSING
    impl: str = "torch"
    micro_batch_size: Optional[int] = None


@dataclass
class SingleConfig(StrategyConfig):
    name: str = "single"


@dataclass
class DDPConfig(StrategyConfig):
    """torch DistributedDataParallel knobs (defaults are torch's)."""

    name: str = "ddp"
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    comm_hook: str = "none"  # none | bf16_compress | fp16_compress: all-reduce gradients in 16 bit


MP_IMPLS = ("megatron", "torch")
MP_SCHEDULES = ("auto", "gpipe", "1f1b", "interleaved_1f1b")
MP_SPECS = ("auto", "sdpa", "local", "te")
MP_INITS = ("bench", "megatron")
# strategy.cuda_graph: steps 0 .. CUDA_GRAPH_CAPTURE_STEP - 1 run eagerly (NCCL communicators, the
# allocator and cuBLAS set themselves up); that step is captured and every later one replays it
CUDA_GRAPH_CAPTURE_STEP = 2


@dataclass
class ModelParallelConfig(StrategyConfig):
    """One schema for the tp x pp x dp family (strategies ``tp``, ``pp``, ``megatron``; they
    differ only in defaults).  dp = world_size / (tp * pp).  ``impl``: megatron (megatron-core,
    GPU only) or torch (DTensor TP + torch.distributed.pipelining; runs on CPU too)."""

    name: str = "megatron"
    impl: str = "megatron"
    tp: int = 1
    pp: int = 1
    # micro-batches per step on one data-parallel rank: "p", "4p" (k * pp), an int, or null
    # (null: strategy.micro_batch_size decides, one micro-batch by default)
    microbatches: Any = None
    virtual_pipeline: int = 1  # model chunks per pipeline rank (> 1: interleaved 1F1B)
    schedule: str = "auto"  # auto (1f1b, interleaved_1f1b when virtual_pipeline > 1) | gpipe (torch)
    sequence_parallel: bool = False  # Megatron sequence parallelism (needs tp > 1)
    # Megatron DistributedDataParallel / optimizer
    overlap_grad_reduce: bool = True
    use_distributed_optimizer: bool = False
    overlap_param_gather: bool = False  # needs use_distributed_optimizer
    bucket_size: Optional[int] = None  # parameters per gradient bucket; null = Megatron's default
    grad_reduce_in_fp32: bool = True
    # megatron-core without Transformer Engine / Apex falls back to torch AdamW in foreach mode;
    # true runs that AdamW with its fused CUDA kernel instead (what TE/Apex FusedAdam would give)
    fused_adam: bool = True
    # capture each step's forward + backward (all micro-batches, pipeline sends/receives and the
    # gradient all-reduce) as one CUDA graph (megatron.core.full_cuda_graph), replayed from the
    # CUDA_GRAPH_CAPTURE_STEP-th step on: takes the per-kernel launch cost off the host
    cuda_graph: bool = False
    # Megatron's torch.cuda.synchronize() after every batched pipeline send/receive (a workaround
    # for old PyTorch; Megatron's default).  cuda_graph=true turns it off (no sync in a capture)
    batch_p2p_sync: bool = True
    # Megatron model
    spec: str = "auto"  # auto (te if transformer_engine imports, else sdpa) | sdpa | local | te
    init: str = "bench"  # bench: copy bench's GPT init (same weights as strategy=single) | megatron


@dataclass
class TPConfig(ModelParallelConfig):
    name: str = "tp"
    tp: int = 2


@dataclass
class PPConfig(ModelParallelConfig):
    name: str = "pp"
    pp: int = 2
    microbatches: Any = "4p"


ZERO_OFFLOAD = ("none", "cpu")
FSDP_REDUCE_DTYPES = ("fp32", "param")


@dataclass
class ZeroFP16Config:
    """DeepSpeed fp16 dynamic loss scaling (DeepSpeed's defaults; used only when precision=fp16)."""

    loss_scale: float = 0.0  # 0 = dynamic loss scaling; > 0 = that static scale
    initial_scale_power: int = 16  # first scale = 2**initial_scale_power
    loss_scale_window: int = 1000  # steps without overflow before the scale doubles
    hysteresis: int = 2  # overflows tolerated before the scale is lowered
    consecutive_hysteresis: bool = False  # refill hysteresis on every non-overflow step
    min_loss_scale: float = 1.0


@dataclass
class ZeroConfig(StrategyConfig):
    """DeepSpeed ZeRO through deepspeed.initialize (defaults are DeepSpeed 0.19's).

    Sizes are numbers of elements; they are floats so that 5e8 can be written."""

    name: str = "zero"
    impl: str = "deepspeed"
    zero_stage: int = 0
    autocast: bool = False  # bf16/fp16 through DeepSpeed's torch_autocast (fp32 weights), not its 16-bit wrapper
    offload_optimizer: str = "none"  # none | cpu (stages 1-3)
    offload_param: str = "none"  # none | cpu (stage 3)
    reduce_bucket_size: float = 5e8
    allgather_bucket_size: float = 5e8
    overlap_comm: Optional[bool] = None  # null = DeepSpeed's default: true for stage 3, else false
    contiguous_gradients: bool = True
    compute_grad_norm: bool = True  # stages 1-2: false skips DeepSpeed's per-step gradient norm (no clipping)
    prefetch_bucket_size: float = 5e7  # stage 3
    param_persistence_threshold: float = 1e5  # stage 3
    max_live_parameters: float = 1e9  # stage 3
    leaf_blocks: bool = False  # stage 3: each transformer block one ZeRO-3 leaf module (fewer host-side hooks)
    deepcompile: bool = False  # DeepSpeed's DeepCompile backend for engine.compile (compile=true, stages 1-3, CUDA)
    fp16: ZeroFP16Config = field(default_factory=ZeroFP16Config)
    ds_config: dict[str, Any] = field(default_factory=dict)  # raw DeepSpeed config, deep-merged last


@dataclass
class FSDPConfig(StrategyConfig):
    """PyTorch FSDP2 (fully_shard) knobs (defaults are torch's)."""

    name: str = "fsdp"
    reshard_after_forward: bool = True  # true ~ ZeRO-3, false ~ ZeRO-2
    reduce_dtype: str = "fp32"  # fp32 | param (gradient reduce-scatter dtype under bf16/fp16)
    cpu_offload: bool = False  # CPUOffloadPolicy: sharded params, grads, optimizer on the host
    prefetch: int = 0  # 0: FSDP2's implicit prefetching; k >= 1: explicitly prefetch the next k units
    blocks_per_unit: int = 1  # consecutive transformer blocks per FSDP unit (one all-gather / reduce-scatter each)


@dataclass
class OptimConfig:
    lr: float = 3.0e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 0.0  # 0 disables clipping


@dataclass
class MetricsConfig:
    nvml_interval_ms: int = 100  # NVML sampling period of the background thread
    peak_tflops: Optional[float] = None  # overrides the device table for MFU
    measure_matmul_peak: bool = True  # time a bf16 8192^3 matmul on GPU for a measured MFU
    profile_steps: int = 0  # >0: re-run the last k steps under torch.profiler after timing (bench/metrics/profile.py)
    # how a timed step is timed on CUDA (bench/worker.py): "events" = CUDA events, one synchronize after
    # the window; "sync" = torch.cuda.synchronize after every step + perf_counter (serialises host and GPU)
    step_timing: str = "events"


@dataclass
class FaultConfig:
    """Fault injection, for testing failure handling: ``kind`` happens on ``rank`` at ``step``."""

    kind: str = "none"  # none | raise | oom | hang | crash_at_exit / hang_at_exit (after the run, ignoring step) | stuck_at_exit (every rank)
    rank: int = 0
    step: int = 0


@dataclass
class BenchConfig:
    model: ModelConfig = MISSING
    strategy: Any = MISSING
    world_size: int = 1
    precision: str = "bf16"
    steps: int = 20  # optimizer steps in all, warm-up included
    warmup_steps: int = 5  # not timed
    seed: int = 0
    device: str = "auto"
    compile: bool = False
    compile_mode: str = "default"  # torch.compile mode: default | reduce-overhead | max-autotune-no-cudagraphs
    tf32: bool = False  # allow TF32 matmuls when precision=fp32 on GPU
    optim: OptimConfig = field(default_factory=OptimConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    dist_timeout_s: int = 600  # collective timeout of the process group
    run_timeout_s: Optional[int] = None  # wall-clock limit of a run; its processes are ended after it
    # a rank whose teardown (after the results are written) takes longer is ended, its result kept
    teardown_timeout_s: int = 30
    # how a run's local ranks start (bench/launch.py): "forkserver" forks them from a server process
    # that imported torch and bench once (a sweep's later runs reuse it); "spawn" starts each afresh
    start_method: str = "forkserver"
    # where a run's local ranks may run on the host's CPUs: "none" leaves it to the OS; "split" pins
    # each local rank to its own equal, contiguous share of the CPUs the run may use (Linux)
    cpu_affinity: str = "none"
    # sweeps (bench/sweep.py): neither changes what a run measures, so neither is part of a run's key
    resume: bool = False  # skip runs whose configuration already has a completed result in the sweep folder
    rerun_failed: bool = False  # with resume: run again those whose result is failed/oom/timeout/interrupted
    # free-form values presets interpolate (e.g. a per-world-size table); the runner never reads them
    vars: dict[str, Any] = field(default_factory=dict)


STRATEGY_SCHEMAS: dict[str, type] = {
    "single": SingleConfig, "ddp": DDPConfig, "zero": ZeroConfig, "fsdp": FSDPConfig,
    "tp": TPConfig, "pp": PPConfig, "megatron": ModelParallelConfig,
}


def register_configs() -> None:
    """Register the schemas; conf/*.yaml name them in their defaults lists."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    for name, schema in STRATEGY_SCHEMAS.items():
        cs.store(group="strategy", name=f"{name}_schema", node=schema)


# --------------------------------------------------------------------------- plan
@dataclass
class Plan:
    """A validated run: the config plus everything derived from it."""

    cfg: dict  # resolved config (plain containers)
    device: str  # "cuda" | "cpu"
    backend: str  # "nccl" | "gloo"
    world_size: int
    tp: int  # tensor-parallel size
    pp: int  # pipeline-parallel size
    dp_size: int  # data-parallel replicas: world_size / (tp * pp)
    micro_batch_size: int  # sequences per micro-batch on one data-parallel rank
    grad_accum: int  # micro-batches per optimizer step on one data-parallel rank

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Plan":
        return Plan(**d)

    @property
    def model(self) -> dict:
        return self.cfg["model"]

    @property
    def strategy(self) -> dict:
        return self.cfg["strategy"]


def _choice(key: str, value: Any, valid: tuple) -> None:
    if value not in valid:
        raise ConfigError(key, value, f"valid: {', '.join(map(str, valid))}")


def _positive(key: str, value: int) -> None:
    if value is None or value <= 0:
        raise ConfigError(key, value, "must be a positive integer")


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def validate(cfg: DictConfig | dict, gpus: Optional[int] = None) -> Plan:
    """Check every cross-field rule; return the Plan or raise ConfigError.

    ``gpus`` is the number of visible CUDA devices (looked up when None)."""
    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    m, s = c["model"], c["strategy"]

    for key in ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size", "seq_len", "global_batch"):
        _positive(f"model.{key}", m[key])
    if m["d_model"] % m["n_heads"]:
        raise ConfigError("model.n_heads", m["n_heads"], f"must divide model.d_model={m['d_model']}")
    _positive("world_size", c["world_size"])
    _positive("steps", c["steps"])
    _choice("start_method", c["start_method"], START_METHODS)
    _choice("cpu_affinity", c["cpu_affinity"], CPU_AFFINITIES)
    if c["cpu_affinity"] == "split" and not hasattr(os, "sched_setaffinity"):
        raise ConfigError("cpu_affinity", "split", "pinning ranks to CPUs needs Linux (os.sched_setaffinity); "
                          "use cpu_affinity=none")
    if c["run_timeout_s"] is not None and c["run_timeout_s"] <= 0:
        raise ConfigError("run_timeout_s", c["run_timeout_s"], "must be a positive number of seconds or null")
    _positive("teardown_timeout_s", c["teardown_timeout_s"])
    if c["warmup_steps"] < 0 or c["warmup_steps"] >= c["steps"]:
        raise ConfigError("warmup_steps", c["warmup_steps"],
                          f"must be >= 0 and < steps={c['steps']} (at least one timed step)")
    if not 0 <= c["metrics"]["profile_steps"] <= c["steps"]:
        raise ConfigError("metrics.profile_steps", c["metrics"]["profile_steps"],
                          f"must be 0 (off) .. steps={c['steps']} (the last k steps are re-run under the profiler)")
    _choice("metrics.step_timing", c["metrics"]["step_timing"], STEP_TIMINGS)
    _choice("precision", c["precision"], PRECISIONS)
    _choice("device", c["device"], DEVICES)
    _choice("compile_mode", c["compile_mode"], COMPILE_MODES)
    if c["compile_mode"] != "default" and not c["compile"]:
        raise ConfigError("compile_mode", c["compile_mode"], "takes effect only with compile=true; add compile=true "
                          "or leave compile_mode=default")
    _choice("fault.kind", c["fault"]["kind"], FAULT_KINDS)
    _choice("strategy", s["name"], tuple(STRATEGY_SCHEMAS))

    gpus = cuda_device_count() if gpus is None else gpus
    device = c["device"]
    if device == "auto":
        device = "cuda" if gpus > 0 else "cpu"
    if device == "cuda" and gpus == 0:
        raise ConfigError("device", "cuda", "no CUDA device is visible; use device=cpu or device=auto")
    if device == "cuda" and c["world_size"] > gpus:
        raise ConfigError("world_size", c["world_size"],
                          f"only {gpus} CUDA device(s) visible on this node; use world_size<={gpus} "
                          "(or hydra/launcher=slurm for several nodes)")
    if device == "cpu" and c["precision"] == "fp16":
        raise ConfigError("precision", "fp16", "fp16 needs a GPU; on CPU use fp32 or bf16")

    ws = c["world_size"]
    if s["name"] == "single" and ws != 1:
        raise ConfigError("world_size", ws, "strategy=single runs on exactly 1 device; use world_size=1 "
                                            "or a parallel strategy (e.g. strategy=ddp)")
    # One description of the parallel layout: tp x pp x dp = world_size.
    tp, pp = s.get("tp", 1), s.get("pp", 1)
    _positive("strategy.tp", tp)
    _positive("strategy.pp", pp)
    if ws % (tp * pp):
        raise ConfigError("world_size", ws, f"must be a multiple of strategy.tp x strategy.pp = {tp * pp}")
    dp = ws // (tp * pp)
    gb = m["global_batch"]
    if gb % dp:
        raise ConfigError("model.global_batch", gb,
                          f"must be divisible by the data-parallel size {dp} (world_size={ws})")
    per_rank = gb // dp
    mbs = s.get("micro_batch_size") or per_rank
    if mbs <= 0 or per_rank % mbs:
        raise ConfigError("strategy.micro_batch_size", s.get("micro_batch_size"),
                          f"must divide the per-rank batch {per_rank} (= global_batch {gb} / dp {dp})")

    plan = Plan(cfg=c, device=device, backend="nccl" if device == "cuda" else "gloo", world_size=ws,
                tp=tp, pp=pp, dp_size=dp, micro_batch_size=mbs, grad_accum=per_rank // mbs)
    rule = STRATEGY_RULES.get(s["name"])
    if rule is not None:
        rule(plan)
    return plan


# --------------------------------------------------------------------------- per-strategy rules
# Each strategy's own cross-field rules, here so that every rule lives in this one file.
# A rule takes the Plan (plan.cfg is the resolved config) and raises ConfigError.

def _rules_ddp(plan: Plan) -> None:
    s = plan.strategy
    if s["bucket_cap_mb"] <= 0:
        raise ConfigError("strategy.bucket_cap_mb", s["bucket_cap_mb"], "must be > 0")
    _choice("strategy.comm_hook", s["comm_hook"], DDP_COMM_HOOKS)
    if s["comm_hook"] == "bf16_compress" and plan.device != "cuda":
        raise ConfigError("strategy.comm_hook", s["comm_hook"], "needs NCCL (a GPU); on CPU use none or fp16_compress")


def _megatron_core_installed() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("megatron.core") is not None
    except (ImportError, ValueError):
        return False


def _rules_model_parallel(plan: Plan) -> None:
    """tp / pp / megatron (one schema): the tp x pp x dp layout beyond the generic checks.
    Resolves ``strategy.microbatches`` into plan.micro_batch_size / plan.grad_accum."""
    from bench.layout import resolve_microbatches

    s, m, c = plan.strategy, plan.model, plan.cfg
    name, impl, tp, pp, dp = s["name"], s["impl"], plan.tp, plan.pp, plan.dp_size
    _choice("strategy.impl", impl, MP_IMPLS)
    if name == "megatron" and impl != "megatron":
        raise ConfigError("strategy.impl", impl, "strategy=megatron is megatron-core only; for torch-native "
                          "parallelism use strategy=tp or strategy=pp with strategy.impl=torch, or strategy=ddp")
    if impl == "megatron":
        fix = ("use strategy=ddp (or strategy=tp/pp with strategy.impl=torch)" if name == "megatron"
               else "use strategy.impl=torch (torch-native TP/PP, runs on CPU)")
        if plan.device != "cuda":
            raise ConfigError("strategy.impl", impl, f"megatron-core needs CUDA GPUs, and this run has none "
                              f"(device={plan.device}); {fix}")
        if not _megatron_core_installed():
            raise ConfigError("strategy.impl", impl, f"megatron-core is not installed (pip install megatron-core); {fix}")

    # shapes that tensor / pipeline parallelism must split evenly
    if m["n_heads"] % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.n_heads={m['n_heads']} (attention heads are split over tp)")
    if m["d_ff"] % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.d_ff={m['d_ff']} (the MLP is split over tp)")
    if impl == "megatron" and m["vocab_size"] % tp:
        raise ConfigError("strategy.tp", tp, f"must divide model.vocab_size={m['vocab_size']} "
                          "(Megatron splits the embedding and output layer over tp)")
    v = s["virtual_pipeline"]
    _positive("strategy.virtual_pipeline", v)
    if v > 1 and pp == 1:
        raise ConfigError("strategy.virtual_pipeline", v, "interleaved stages need strategy.pp > 1; use virtual_pipeline=1")
    if m["n_layers"] % (pp * v):
        raise ConfigError("strategy.pp", pp, f"strategy.pp x strategy.virtual_pipeline = {pp} x {v} = {pp * v} "
                          f"stages must divide model.n_layers={m['n_layers']}")

    # schedule
    _choice("strategy.schedule", s["schedule"], MP_SCHEDULES)
    sched = s["schedule"]
    if sched == "auto":
        sched = "interleaved_1f1b" if v > 1 else "1f1b"
    if sched == "interleaved_1f1b" and v < 2:
        raise ConfigError("strategy.schedule", sched, "needs strategy.virtual_pipeline >= 2 (model chunks per "
                          "pipeline rank); or use schedule=1f1b / gpipe")
    if sched in ("gpipe", "1f1b") and v > 1:
        raise ConfigError("strategy.schedule", sched, f"runs one stage per rank, but strategy.virtual_pipeline={v}; "
                          "use schedule=interleaved_1f1b (or auto), or virtual_pipeline=1")
    if sched == "gpipe" and impl == "megatron":
        raise ConfigError("strategy.schedule", sched, "megatron-core has no GPipe schedule (it runs 1F1B); "
                          "use strategy.impl=torch for GPipe, or schedule=1f1b")

    # micro-batches: the per-data-parallel-rank batch split for the pipeline / accumulation
    per_rank = m["global_batch"] // dp
    if s["microbatches"] is not None:
        try:
            n_micro = resolve_microbatches(s["microbatches"], pp)
        except ValueError:
            raise ConfigError("strategy.microbatches", s["microbatches"],
                              'must be "p", "<k>p" (k x strategy.pp), a positive integer, or null') from None
        if per_rank % n_micro:
            raise ConfigError("strategy.microbatches", s["microbatches"],
                              f"= {n_micro} micro-batches must divide the per-data-parallel-rank batch {per_rank} "
                              f"(= model.global_batch {m['global_batch']} / dp {dp}); use fewer micro-batches "
                              "or a larger model.global_batch")
        mbs = per_rank // n_micro
        if s.get("micro_batch_size") not in (None, mbs):
            raise ConfigError("strategy.micro_batch_size", s["micro_batch_size"],
                              f"conflicts with strategy.microbatches={s['microbatches']} ({n_micro} micro-batches "
                              f"of {mbs}); set only one of them")
        plan.micro_batch_size, plan.grad_accum = mbs, n_micro
    n_micro = plan.grad_accum
    if sched == "interleaved_1f1b":
        if impl == "megatron" and n_micro % pp:
            raise ConfigError("strategy.microbatches", s["microbatches"],
                              f"Megatron's interleaved schedule needs the number of micro-batches ({n_micro}) "
                              f"to be a multiple of strategy.pp={pp}")
        if impl == "torch" and n_micro % max(1, n_micro // pp):
            raise ConfigError("strategy.microbatches", s["microbatches"],
                              f"torch's interleaved 1F1B needs the number of micro-batches ({n_micro}) to be a "
                              f"multiple of its rounds max(1, {n_micro} // pp)")

    if s["sequence_parallel"]:
        if tp == 1:
            raise ConfigError("strategy.sequence_parallel", True, "needs strategy.tp > 1")
        if impl == "torch":
            raise ConfigError("strategy.sequence_parallel", True, "is implemented for strategy.impl=megatron only; "
                              "use sequence_parallel=false with impl=torch")
        if m["seq_len"] % tp:
            raise ConfigError("strategy.sequence_parallel", True, f"needs model.seq_len={m['seq_len']} divisible "
                              f"by strategy.tp={tp}")
    if impl == "torch" and c["precision"] == "fp16":
        raise ConfigError("precision", "fp16", "is not supported with strategy.impl=torch (no loss scaling across "
                          "shards and stages); use precision=bf16, or strategy.impl=megatron")
    if c["compile"] and impl == "megatron":
        raise ConfigError("compile", True, f"is not implemented for strategy={name} with strategy.impl=megatron; "
                          "use compile=false, or strategy.impl=torch (compiles each transformer block)")

    # Megatron DDP / optimizer / model knobs (ignored by impl=torch)
    _choice("strategy.spec", s["spec"], MP_SPECS)
    _choice("strategy.init", s["init"], MP_INITS)
    if s["bucket_size"] is not None and s["bucket_size"] <= 0:
        raise ConfigError("strategy.bucket_size", s["bucket_size"], "must be a positive number of parameters, or null")
    if s["overlap_param_gather"] and not s["use_distributed_optimizer"]:
        raise ConfigError("strategy.overlap_param_gather", True, "needs strategy.use_distributed_optimizer=true")
    if s["cuda_graph"]:
        if impl != "megatron":
            raise ConfigError("strategy.cuda_graph", True, "is implemented for strategy.impl=megatron only; "
                              "with impl=torch use compile=true")
        if s["overlap_param_gather"]:
            raise ConfigError("strategy.cuda_graph", True, "cannot capture strategy.overlap_param_gather's "
                              "forward hooks; set overlap_param_gather=false")
        if c["precision"] == "fp16":
            raise ConfigError("strategy.cuda_graph", True, "with precision=fp16: the dynamic loss scale is a new "
                              "tensor after each change, which a captured graph would not see; use bf16 or fp32")
        if c["warmup_steps"] <= CUDA_GRAPH_CAPTURE_STEP:
            raise ConfigError("warmup_steps", c["warmup_steps"], f"must be > {CUDA_GRAPH_CAPTURE_STEP} with "
                              f"strategy.cuda_graph=true: steps 0-{CUDA_GRAPH_CAPTURE_STEP - 1} run eagerly and step "
                              f"{CUDA_GRAPH_CAPTURE_STEP} is captured, so no timed step includes the capture")


def _whole_positive(key: str, value: Any, allow_zero: bool = False) -> None:
    """A size in elements (a float in the schema, so 5e8 can be written): a whole number > 0."""
    ok = isinstance(value, (int, float)) and float(value).is_integer() and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ConfigError(key, value, f"must be a whole number {'>= 0' if allow_zero else '> 0'} (elements)")


# keys of the DeepSpeed config that bench derives itself (batch layout): ds_config may not set them
ZERO_DERIVED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _rules_zero(plan: Plan) -> None:
    s = plan.strategy
    _choice("strategy.zero_stage", s["zero_stage"], (0, 1, 2, 3))
    stage = s["zero_stage"]
    _choice("strategy.offload_optimizer", s["offload_optimizer"], ZERO_OFFLOAD)
    _choice("strategy.offload_param", s["offload_param"], ZERO_OFFLOAD)
    if s["offload_optimizer"] != "none" and stage == 0:
        raise ConfigError("strategy.offload_optimizer", s["offload_optimizer"],
                          "optimizer offload needs ZeRO stage 1, 2 or 3 (strategy.zero_stage=0 here); "
                          "use offload_optimizer=none or zero_stage>=1")
    if s["offload_param"] != "none" and stage != 3:
        raise ConfigError("strategy.offload_param", s["offload_param"],
                          f"parameter offload needs ZeRO stage 3 (strategy.zero_stage={stage} here); "
                          "use offload_param=none or zero_stage=3")
    for key in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size", "max_live_parameters"):
        _whole_positive(f"strategy.{key}", s[key])
    _whole_positive("strategy.param_persistence_threshold", s["param_persistence_threshold"], allow_zero=True)
    if not s["compute_grad_norm"]:
        _rules_no_grad_norm(plan)
    if s["leaf_blocks"] and stage != 3:
        raise ConfigError("strategy.leaf_blocks", True, f"leaf modules are a ZeRO-3 notion (strategy.zero_stage={stage} "
                          "here); use zero_stage=3 or leaf_blocks=false")
    if s["deepcompile"]:
        _rules_deepcompile(plan)
    if stage == 3 and plan.cfg["compile"] and plan.device == "cuda" and not s["deepcompile"]:
        # results/2026-11-23-h200-compile-mode-zero-profiles: on an H200 every compiled ZeRO-3 run
        # (fp32, bf16, autocast, overlap on/off) left single's loss curve from its second step
        raise ConfigError("compile", True, "with strategy.zero_stage=3 on CUDA, DeepSpeed 0.19.8's engine.compile "
                          "trains a different model (measured on an H200: 300m fp32 loss after 8 steps 9.153 against "
                          "9.095 eager and single); use compile=false, zero_stage 0-2, or strategy.deepcompile=true "
                          "(DeepSpeed's own compiler for ZeRO-3, which kept the losses)")
    f = s["fp16"]
    if s["autocast"] and plan.cfg["precision"] == "fp32":
        raise ConfigError("strategy.autocast", True, "autocast runs the forward in bf16 or fp16; set precision=bf16 "
                          "or precision=fp16, or strategy.autocast=false for fp32")
    if s["autocast"] and plan.cfg["precision"] == "fp16":
        changed = [k for k, v in dataclasses.asdict(ZeroFP16Config()).items() if f[k] != v]
        if changed:
            raise ConfigError(f"strategy.fp16.{changed[0]}", f[changed[0]],
                              "applies to DeepSpeed's own fp16 only; with strategy.autocast=true the loss scaling "
                              "is torch's GradScaler at its defaults (leave strategy.fp16 unset or set autocast=false)")
    if f["loss_scale"] < 0:
        raise ConfigError("strategy.fp16.loss_scale", f["loss_scale"], "must be >= 0 (0 = dynamic loss scaling)")
    if not 0 <= f["initial_scale_power"] <= 64:
        raise ConfigError("strategy.fp16.initial_scale_power", f["initial_scale_power"], "must be in 0..64")
    _positive("strategy.fp16.loss_scale_window", f["loss_scale_window"])
    _positive("strategy.fp16.hysteresis", f["hysteresis"])
    if f["min_loss_scale"] <= 0:
        raise ConfigError("strategy.fp16.min_loss_scale", f["min_loss_scale"], "must be > 0")
    for key in ZERO_DERIVED_KEYS:
        if key in (s["ds_config"] or {}):
            raise ConfigError(f"strategy.ds_config.{key}", s["ds_config"][key],
                              "is derived from model.global_batch and strategy.micro_batch_size; set those instead")


def _rules_no_grad_norm(plan: Plan) -> None:
    """DeepSpeed 0.19.8 accepts zero_optimization.compute_grad_norm=false only where nothing needs the norm;
    it would raise these inside deepspeed.initialize on every rank."""
    s, c = plan.strategy, plan.cfg
    stage = s["zero_stage"]
    if stage not in (1, 2):
        raise ConfigError("strategy.compute_grad_norm", False, f"only ZeRO stages 1-2 can skip the gradient norm "
                          f"(strategy.zero_stage={stage} here); use zero_stage=1 or 2, or compute_grad_norm=true")
    if c["optim"]["grad_clip"] > 0:
        raise ConfigError("strategy.compute_grad_norm", False, f"clipping needs the gradient norm "
                          f"(optim.grad_clip={c['optim']['grad_clip']}); set optim.grad_clip=0 or compute_grad_norm=true")
    if s["offload_optimizer"] != "none":
        raise ConfigError("strategy.compute_grad_norm", False, "DeepSpeed's optimizer offload always computes the "
                          "norm; use offload_optimizer=none or compute_grad_norm=true")
    accum = ((s["ds_config"] or {}).get("data_types") or {}).get("grad_accum_dtype")
    if stage == 1 and c["precision"] == "bf16" and not s["autocast"] and accum == "fp32":
        raise ConfigError("strategy.compute_grad_norm", False, "ZeRO-1 in DeepSpeed's own bf16 with "
                          "strategy.ds_config.data_types.grad_accum_dtype=fp32 runs its BF16_Optimizer, which always "
                          "computes the norm; drop that grad_accum_dtype, use zero_stage=2, or compute_grad_norm=true")


def _rules_deepcompile(plan: Plan) -> None:
    """DeepCompile is a torch.compile backend that DeepSpeed installs in engine.compile (ZeRO-1/2/3
    passes, a CUDA op); DeepSpeed would silently fall back to plain torch.compile otherwise."""
    s, c = plan.strategy, plan.cfg
    if not c["compile"]:
        raise ConfigError("strategy.deepcompile", True, "DeepCompile runs through engine.compile; set compile=true "
                          "(or strategy.deepcompile=false)")
    if s["zero_stage"] == 0:
        raise ConfigError("strategy.deepcompile", True, "DeepCompile has passes for ZeRO stages 1-3 only "
                          "(DeepSpeed falls back to plain torch.compile at stage 0); use strategy.zero_stage=1, 2 or 3")
    if plan.device != "cuda":
        raise ConfigError("strategy.deepcompile", True, f"DeepCompile runs on CUDA only (this run's device is "
                          f"{plan.device}); set strategy.deepcompile=false")
    if s["leaf_blocks"]:  # results/2026-11-23-h200-zero3-leaf-deepcompile: "'weight' must be 2-D" in the first forward
        raise ConfigError("strategy.leaf_blocks", True, "DeepCompile gathers ZeRO-3 parameters in its graph and fails "
                          "on leaf modules (DeepSpeed 0.19.8); use leaf_blocks=false with deepcompile, or deepcompile=false")
    if c["compile_mode"] != "default":
        raise ConfigError("compile_mode", c["compile_mode"], "DeepCompile compiles with its own Inductor backend, "
                          "which takes no mode; use compile_mode=default with strategy.deepcompile=true")


def _rules_fsdp(plan: Plan) -> None:
    s = plan.strategy
    _choice("strategy.reduce_dtype", s["reduce_dtype"], FSDP_REDUCE_DTYPES)
    if plan.cfg["compile_mode"] == "reduce-overhead":
        # results/2026-11-23-h200-fsdp2-tp-host: 5.1-6.2k tokens/s against 89-100k with compile_mode=default
        raise ConfigError("compile_mode", "reduce-overhead", "CUDA graphs of FSDP2's blocks ran 15-20x slower than "
                          "compile_mode=default (300m, one H200: 1.25-1.66 s per step); use compile_mode=default with "
                          "strategy=fsdp (strategy.blocks_per_unit > 1 cuts its host time instead)")
    n = plan.model["n_layers"]
    if not 1 <= s["blocks_per_unit"] <= n:
        raise ConfigError("strategy.blocks_per_unit", s["blocks_per_unit"],
                          f"must be 1..model.n_layers={n} (consecutive blocks per FSDP unit; 1 = one unit per block)")
    units = -(-n // s["blocks_per_unit"])
    if not 0 <= s["prefetch"] <= units - 1:  # a unit prefetches only the units after it: more is a silent no-op
        raise ConfigError("strategy.prefetch", s["prefetch"],
                          f"must be 0..{units - 1} (0: FSDP2's implicit prefetching, k: the next k units explicitly): "
                          f"strategy.blocks_per_unit={s['blocks_per_unit']} makes {units} FSDP unit(s) of "
                          f"model.n_layers={n} blocks" + (", nothing to prefetch" if units == 1 else ""))


STRATEGY_RULES: dict[str, Callable[[Plan], None]] = {
    "ddp": _rules_ddp, "zero": _rules_zero, "fsdp": _rules_fsdp,
    "tp": _rules_model_parallel, "pp": _rules_model_parallel, "megatron": _rules_model_parallel,
}

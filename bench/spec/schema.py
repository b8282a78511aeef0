"""The shared configuration schema: the dataclasses Hydra composes ``conf/`` over, and the Plan.

Every default lives here (shared keys) or in a strategy's own schema (its module in
bench/strategies/), declared with :func:`knob`, whose metadata says what the key does, its
valid choices, its candidate values for the knob search, and how it enters a run's key:

* ``volatile``: does not change what a run measures (deadlines, resume flags): left out of the
  run key (bench/run/runs.py) and of the analysis' experiment key;
* ``added``: added after runs were first recorded; at its default it is left out of the key, so
  an earlier sweep folder still resumes, and a recorded run that lacks it reads as the default.

This module imports nothing of bench's but the Layout (bench/spec/layout.py, below it): strategies, validation and
run identity build on it.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from omegaconf import MISSING

from bench.spec.layout import Layout


class ConfigError(ValueError):
    """A configuration that cannot run; the message names key, value and valid choices."""

    def __init__(self, key: str, value: Any, valid: str):
        self.key, self.value, self.valid = key, value, valid
        super().__init__(f"invalid config: {key}={value!r}: {valid}")


def knob(default: Any = MISSING, doc: str = "", *, choices: Optional[tuple] = None, tune: Optional[tuple] = None,
         requires: Optional[dict] = None, added: bool = False, volatile: bool = False, alias: Optional[str] = None,
         factory: Optional[Callable[[], Any]] = None, fallback: Optional[tuple] = None, tune_nodes: bool = False):
    """A schema field with its documentation (docs/knobs.md is generated from it), its valid
    ``choices`` (checked by bench.run.config.validate), its candidate values for the knob search
    (``tune``) and the settings such a candidate needs to take effect (``requires``, dotted key ->
    value: compile_mode needs compile=true), its run-key rule (``added``, ``volatile``: module
    docstring), and for a top-level shorthand the strategy key it sets (``alias``).  For the planner
    (bench/planner/search.py): ``fallback``, candidates tried only where the strategy has no layout that fits
    without them (an offload: host memory and PCIe time for device memory); ``tune_nodes``, the job's number of
    nodes tried as the knob's value where it spans several (replicas across nodes, shards inside one)."""
    md = {"doc": doc, "choices": choices, "tune": tune, "requires": requires, "added": added,
          "volatile": volatile or bool(alias), "alias": alias, "fallback": fallback, "tune_nodes": tune_nodes}
    if factory is not None:
        return field(default_factory=factory, metadata=md)
    return field(default=default, metadata=md)


def fields_of(schema: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(schema)}


def alias_default(key: str, default: Any) -> str:
    """A strategy field's default that a top-level shorthand can set (``zero_stage=3`` -> strategy.zero_stage):
    an interpolation of the shorthand, resolved by bench.run.config's ``bench_alias`` resolver."""
    return f"${{bench_alias:{key},{'null' if default is None else default}}}"


# the names of bench/machine/link_regime.py's REGIMES (kept here: this module imports nothing of bench's above the Layout)
LINK_REGIMES = ("default", "p2p_off", "sockets", "few_channels")


def check_choice(key: str, value: Any, valid: tuple) -> None:
    if value not in valid:
        raise ConfigError(key, value, f"valid: {', '.join(map(str, valid))}")


def check_positive(key: str, value: Any) -> None:
    if value is None or isinstance(value, bool) or value <= 0:
        raise ConfigError(key, value, "must be a positive integer")


def check_whole(key: str, value: Any, allow_zero: bool = False) -> None:
    """A size in elements (a float in the schema, so 5e8 can be written): a whole number > 0."""
    ok = isinstance(value, (int, float)) and float(value).is_integer() and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ConfigError(key, value, f"must be a whole number {'>= 0' if allow_zero else '> 0'} (elements)")


# --------------------------------------------------------------------------- typed sections
def setting(config: Any, dotted: str) -> Any:
    """A setting by its dotted key (``strategy.cp``, ``compile``) in a typed run description or a config's plain
    containers; None where a section lacks it (a knob another strategy's schema has)."""
    x = config
    for part in dotted.split("."):
        x = getattr(x, part, None) if dataclasses.is_dataclass(x) else x.get(part) if isinstance(x, dict) else None
    return x


class Section:
    """A section of the run description (model, strategy, hardware, ...): a dataclass, read by attribute only
    (bench/run/config.py ``describe_run`` builds it; tests/test_run_description.py keeps it so)."""


def typed(cls: type, values: dict, sections: Optional[dict] = None) -> Any:
    """``cls`` (a schema dataclass) from plain containers: nested sections typed by their field's default (or by
    ``sections``, {field: class}, for the fields typed Any: the strategy's schema, the hardware's); a key the values
    lack at its default; a key the schema lacks is not carried (validation refuses those before this)."""
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        v, sub = values[f.name], (sections or {}).get(f.name)
        if sub is None and f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            sub = f.default_factory
        if sub is None and dataclasses.is_dataclass(f.default) and not isinstance(f.default, type):
            sub = type(f.default)
        kw[f.name] = typed(sub, v) if sub is not None and isinstance(v, dict) else copy.deepcopy(v)
    return cls(**kw)


# --------------------------------------------------------------------------- shared schema
@dataclass
class ModelConfig(Section):
    """The model every strategy trains; batch and sequence belong to the model preset."""

    name: str = MISSING
    arch: str = knob("gpt", "gpt: LayerNorm, GELU MLP, learned positions, biases (the GPT of Akbulut et al., 'Distributed Training "
                     "Strategies on Commodity Hardware'); llama: "
                     "RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention, no biases",
                     choices=("gpt", "llama"), added=True)
    d_model: int = MISSING
    n_heads: int = MISSING
    n_kv_heads: Optional[int] = knob(None, "key/value heads (grouped-query attention, llama); null = n_heads",
                                     added=True)
    n_layers: int = MISSING
    d_ff: int = MISSING
    vocab_size: int = 8000
    seq_len: int = MISSING
    global_batch: int = MISSING  # sequences per optimizer step, over all ranks
    tie_embeddings: bool = knob(False, "the output projection shares the token embedding's weight", added=True)
    rope_theta: float = knob(500000.0, "rotary embedding base (llama)", added=True)
    norm_eps: float = knob(1e-5, "LayerNorm / RMSNorm epsilon", added=True)
    qkv_bias: bool = knob(False, "biases on the q/k/v projections of arch=llama (Qwen2); gpt has biases on every linear",
                          added=True)
    mlp_act: str = knob("silu", "the gated MLP's activation of arch=llama: silu (SwiGLU, Llama) | gelu_tanh (GeGLU, "
                        "Gemma); arch=gpt's MLP is tanh-GELU", choices=("silu", "gelu_tanh"), added=True)
    hf_config: Optional[str] = knob(None, "with model=hf: a Hugging Face config.json, a model folder holding one, or a "
                                    "Hub name in the local HF cache; the model's sizes come from it (docs/models.md)",
                                    added=True)
    hf_config_file: Optional[str] = knob(None, "set by bench, not by you: the config.json model.hf_config resolved "
                                         "to (a Hub name: org/name@snapshot), recorded with the run", added=True)


@dataclass
class StrategyConfig(Section):
    """Fields every strategy has. ``micro_batch_size`` is per data-parallel rank; null means one
    micro-batch per step (no gradient accumulation); auto, the largest the memory plan fits (bench/run/config.py)."""

    name: str = MISSING
    impl: str = "torch"
    micro_batch_size: Any = knob(None, "sequences per micro-batch on one data-parallel rank, the rest of the per-rank "
                                 "batch by gradient accumulation: null (the whole per-rank batch at once) | an int "
                                 "dividing it | auto (the largest the memory plan fits on this GPU, hardware preset or "
                                 "memory_gib; on CPU without memory_gib, the whole per-rank batch)",
                                 tune=(1, 2, 4, 8), requires={"strategy.microbatches": None})


@dataclass
class OptimConfig(Section):
    lr: float = 3.0e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = knob(0.0, "global gradient-norm clipping; 0 disables it")


@dataclass
class MetricsConfig(Section):
    nvml_interval_ms: int = knob(100, "NVML sampling period of the background thread")
    peak_tflops: Optional[float] = knob(None, "overrides the device table for MFU")
    measure_matmul_peak: bool = knob(True, "time a bf16 8192^3 matmul on GPU for a measured MFU denominator")
    profile_steps: int = knob(0, "> 0: re-run the last k steps under torch.profiler after the timed window")
    step_timing: str = knob("events", "how a timed step is timed on CUDA: events (CUDA events, one synchronize after "
                            "the window) | sync (synchronize after every step: serialises host and GPU)",
                            choices=("events", "sync"))


@dataclass
class FaultConfig(Section):
    """Fault injection, for testing failure handling: ``kind`` happens on ``rank`` at ``step``."""

    kind: str = knob("none", "none | raise | oom | hang on one rank at one step; crash_at_exit / hang_at_exit "
                     "(after the run) | stuck_at_exit (every rank)",
                     choices=("none", "raise", "oom", "hang", "crash_at_exit", "hang_at_exit", "stuck_at_exit"))
    rank: int = 0
    step: int = 0


@dataclass
class LoggerConfig(Section):
    """Where a run's config, per-step series and summary go at its end (bench/metrics/loggers.py)."""

    name: str = knob("none", "none | tensorboard | mlflow | wandb", choices=("none", "tensorboard", "mlflow", "wandb"))
    dir: Optional[str] = knob(None, "null: <sweep dir or run dir>/tensorboard | mlruns | wandb")
    experiment: Optional[str] = knob(None, "MLflow experiment / wandb project; null: the sweep folder / bench")
    tracking_uri: Optional[str] = knob(None, "mlflow: a server or database URI; null: a file store in dir")
    mode: str = knob("offline", "wandb: offline (no server) | online | disabled", choices=("offline", "online", "disabled"))


@dataclass
class BenchConfig(Section):
    model: ModelConfig = MISSING
    strategy: Any = MISSING
    world_size: int = knob(1, "ranks, one per GPU; the global batch is split over the data-parallel ones")
    precision: str = knob("auto", "auto (bf16 on GPU, fp32 on CPU, where bf16 matmuls have no fast kernels) | "
                          "fp32 | bf16 (autocast over fp32 weights) | fp16 (+ loss scaling, GPU only) | fp8 (torchao "
                          "float8 matmuls in the blocks' Linear layers, bf16 elsewhere, fp32 master weights and "
                          "optimizer states; GPUs of compute capability >= 8.9, torch-native strategies, "
                          "compile=true); recorded as what ran", choices=("auto", "fp32", "bf16", "fp16", "fp8"))
    fp8_recipe: str = knob("tensorwise", "precision=fp8: torchao's float8 recipe: tensorwise (one scale per tensor, "
                           "cuBLAS; the fastest) | rowwise (a scale per row, CUTLASS) | rowwise_with_gw_hp (rowwise, "
                           "the weight gradient's matmul in bf16: the most accurate)",
                           choices=("tensorwise", "rowwise", "rowwise_with_gw_hp"), requires={"precision": "fp8"},
                           added=True)
    grad_reduce: str = knob("default", "the precision gradients are summed in across data-parallel ranks, on each "
                            "strategy's own knob (bench/run/grad_reduce.py): default (each strategy's: ZeRO 16 bit, "
                            "the others fp32) | fp32 | 16bit (precision's 16-bit dtype): strategies at equal numerics",
                            choices=("default", "fp32", "16bit"), alias="strategy.<its reduction knob>")
    steps: int = knob(20, "optimizer steps in all, warm-up included")
    warmup_steps: int = knob(5, "steps not timed")
    zero_stage: Optional[int] = knob(None, "shorthand for strategy.zero_stage (strategy=zero zero_stage=3)",
                                     alias="strategy.zero_stage")
    microbatches: Any = knob(None, "shorthand for strategy.microbatches (strategy=pp microbatches=p)",
                             alias="strategy.microbatches")
    seed: int = 0
    device: str = knob("auto", "auto (CUDA when visible) | cuda | cpu", choices=("auto", "cuda", "cpu"))
    compile: bool = knob(False, "torch.compile the model (per block where a wrapper needs it)", tune=(False, True))
    compile_mode: str = knob("default", "torch.compile mode: default | reduce-overhead (CUDA graphs; with one "
                             "micro-batch a step under single, DDP and ZeRO-0/1) | "
                             "max-autotune-no-cudagraphs", choices=("default", "reduce-overhead",
                                                                    "max-autotune-no-cudagraphs"),
                             tune=("default", "reduce-overhead"), requires={"compile": True}, added=True)
    recompute: str = knob("none", "activation recomputation: none | full (each block's forward again in backward, "
                          "only block inputs kept) | selective (the attention core again: Korthikanti et al. 2022) | "
                          "op (torchtitan's op-level selective checkpointing: every block keeps its matmul outputs but "
                          "every second one, and attention's; the rest again in backward)",
                          choices=("none", "full", "selective", "op"), added=True)
    recompute_every: int = knob(1, "with recompute=full: checkpoint every k-th block of a stage (1: all; 2: every "
                                "second, half of full's extra forward and about half of what it saves); recompute=op "
                                "applies to every block (as torchtitan)",
                                added=True)
    loss_chunks: int = knob(1, "the loss over k chunks of tokens, each chunk's head matmul and fp32 cross entropy "
                            "checkpointed: one chunk's logits and loss buffers alive at a time (12 B a logit: Llama-3's "
                            "128k vocabulary at 8k tokens a rank, 11.7 GiB -> 1/k), one more head matmul a token "
                            "(1: the whole logits at once); bench's model's loss (not megatron-core's), no pipeline; the "
                            "planner tries 8 where nothing fits without it", fallback=(1, 8), added=True)
    offload_activations: bool = knob(False, "each transformer block's saved tensors (activations; autocast's weight "
                                     "copies; under recompute=full only its input) to pinned host memory in the "
                                     "forward, back for its backward (torch's offload_wrapper): copies on the compute "
                                     "stream, not hidden; bench's model (not megatron-core's); the planner tries it "
                                     "where nothing fits without it", fallback=(False, True), added=True)
    tf32: bool = knob(False, "allow TF32 matmuls when precision=fp32 on GPU")
    tuning: str = knob("default", "default: every knob as set | best: the strategy's best measured settings "
                       "(its profile; explicit settings win, knobs that cannot apply are skipped and recorded)",
                       choices=("default", "best"), added=True)
    optim: OptimConfig = field(default_factory=OptimConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    logger: LoggerConfig = knob(None, "experiment tracker a run is recorded in at its end (conf/logger/)",
                                volatile=True, factory=LoggerConfig)
    dist_timeout_s: int = knob(600, "collective timeout of the process group", volatile=True)
    run_timeout_s: Optional[int] = knob(None, "wall-clock limit of a run; its processes are ended after it",
                                        volatile=True)
    teardown_timeout_s: int = knob(30, "once the results are written, how long the ranks may take to exit",
                                   volatile=True)
    start_method: str = knob("forkserver", "forkserver (ranks forked from a server that imported torch once) | spawn",
                             choices=("forkserver", "spawn"), volatile=True)
    link_regime: str = knob("default", "how NCCL may link the GPUs of a node (bench/machine/link_regime.py): default (NCCL's "
                            "choice) | p2p_off (through host memory) | sockets (through the network stack) | "
                            "few_channels (at most 2 channels); each run records the transports NCCL used",
                            choices=LINK_REGIMES, added=True)
    allocator: str = knob("default", "the CUDA caching allocator (bench/machine/allocator.py): default | "
                          "expandable_segments (one growing segment: no memory stranded between blocks near the "
                          "device's limit)", choices=("default", "expandable_segments"), added=True)
    cpu_affinity: str = knob("none", "none (the OS places the ranks) | split (each local rank pinned to its own CPUs)",
                             choices=("none", "split"), added=True)
    dry_run: bool = knob(False, "validate and print the memory plan; start no process", volatile=True)
    submit: Optional[str] = knob(None, "slurm: submit the run(s) as SLURM jobs, planned here for hardware= (the "
                                 "cluster's GPU; the job checks the GPU it lands on); set by hydra/launcher=slurm, "
                                 "which then needs no --multirun | null: run on this machine",
                                 choices=(None, "slurm"), volatile=True)
    memory_gib: Optional[float] = knob(None, "device memory the plan checks against (default: hardware's, else the "
                                       "visible GPU's)", volatile=True)
    hardware: Any = knob(MISSING, "the GPU and node a run is planned for: auto (the visible device) | a preset "
                         "(conf group hardware: bench/machine/hardware.py); with a preset dry_run=true or submit=slurm plans on "
                         "any machine",
                         volatile=True)
    force_run: bool = knob(False, "run even when the memory plan predicts an out-of-memory", volatile=True)
    resume: bool = knob(False, "sweeps: skip runs already completed in the sweep folder; run an interrupted one "
                          "again", volatile=True)
    rerun_failed: bool = knob(False, "sweeps, with resume: run failed / oom / timeout ones again", volatile=True)
    vars: dict[str, Any] = knob(None, "free-form values presets interpolate; the runner never reads them",
                                volatile=True, factory=dict)


# --------------------------------------------------------------------------- plan
# the top-level shorthands (zero_stage=3, grad_reduce): validation moves them into the strategy section: said once
_SHORTHANDS = {f.name: f.metadata.get("alias") for f in dataclasses.fields(BenchConfig)}


@dataclass
class Plan:
    """A validated run: the typed run description plus everything derived from it."""

    run: BenchConfig  # the run description, typed: built once by bench/run/config.py (model resolved, hardware named)
    device: str  # "cuda" | "cpu"
    backend: str  # "nccl" | "gloo"
    world_size: int
    layout: Layout  # tp x pp x dp, the pipeline and the micro-batches: built and checked once (bench/spec/layout_rules.py)
    tuning: Optional[dict] = None  # tuning=best: what the profile applied and skipped (bench/run/tuning_profiles.py)
    micro_batch_auto: Optional[dict] = None  # strategy.micro_batch_size=auto: what it chose and why (bench/run/config.py)
    memory: Optional[dict] = None  # the memory plan (bench/plan/memory_model.py), made before launch, recorded by rank 0
    command: Optional[list] = None  # the command line that composed it (recorded as the config's _command)

    @property
    def cfg(self) -> dict:
        """The run description as plain containers: what a record and a run key hold (a copy: write to ``run``)."""
        d = {k: v for k, v in dataclasses.asdict(self.run).items() if not _SHORTHANDS.get(k)}
        if self.command is not None:
            d["_command"] = self.command
        return d

    def to_dict(self) -> dict:
        """Plain containers (the ranks receive it so); bench/run/config.py ``plan_from_dict`` reads it back typed."""
        return dataclasses.asdict(self)

    # the layout's sizes by the names the rest of bench reads them (plan.tp, plan.dp_size, ...)
    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def cp(self) -> int:
        return self.layout.cp

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def micro_batch_size(self) -> int:
        return self.layout.micro_batch_size

    @property
    def grad_accum(self) -> int:
        return self.layout.grad_accum

    @property
    def model(self) -> ModelConfig:
        return self.run.model

    @property
    def strategy(self) -> StrategyConfig:
        return self.run.strategy


# --------------------------------------------------------------------------- layout knobs
# The tp x pp x dp layout knobs of the strategies that split the model (dp = world_size / (tp * pp)), declared
# once here; validation reads them into plan.layout (bench/spec/layout_rules.py).
SCHEDULES = ("auto", "gpipe", "1f1b", "interleaved_1f1b")
LAYOUT_KNOBS = ("tp", "pp", "cp", "microbatches", "virtual_pipeline", "schedule")


def _layout_knobs(added: bool) -> type:
    """The layout knobs as a schema a strategy's inherits.  ``added``: the run-key rule (module docstring) of
    a strategy that gained them after its first recorded runs (at their defaults they stay out of its key)."""

    @dataclass
    class LayoutKnobs(StrategyConfig):
        tp: int = knob(1, "tensor-parallel size: each block's matmuls split over tp ranks", added=added)
        pp: int = knob(1, "pipeline-parallel size: the blocks split into pp stages", added=added)
        microbatches: Any = knob(alias_default("microbatches", None), 'micro-batches per step on one data-parallel '
                                 'rank: "p", "4p" (k x pp), an int, or null (null: strategy.micro_batch_size decides, '
                                 "one micro-batch by default)", added=added)
        virtual_pipeline: int = knob(1, "model chunks per pipeline rank (> 1: interleaved 1F1B)", added=added)
        cp: int = knob(1, "context-parallel size: each sequence split over cp ranks, attention as a ring over them "
                       "(PyTorch's context_parallel; CUDA only); dp = world_size / (tp x pp x cp)", added=True)
        schedule: str = knob("auto", "pipeline schedule: auto (1f1b; interleaved_1f1b when virtual_pipeline > 1) | "
                             "gpipe (torch-native pipelining only) | 1f1b | interleaved_1f1b", choices=SCHEDULES,
                             added=added)

    return LayoutKnobs


LayoutKnobs = _layout_knobs(added=False)  # the tp x pp x dp family's: in its run keys since its first runs
AddedLayoutKnobs = _layout_knobs(added=True)  # a strategy that gained the layout later (fsdp's TP / PP)
AddedLayoutKnobs.__name__ = AddedLayoutKnobs.__qualname__ = "AddedLayoutKnobs"
# strategy.cuda_graph (megatron-core): steps 0 .. CUDA_GRAPH_CAPTURE_STEP - 1 run eagerly (NCCL communicators,
# the allocator and cuBLAS set themselves up); that step is captured and every later one replays it.  Here,
# below the strategies, because the family's warm-up rule and megatron's runner both read it.
CUDA_GRAPH_CAPTURE_STEP = 2

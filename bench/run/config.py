"""The one place where a configuration is checked: Hydra's schema registration and ``validate``.

Hydra composes ``conf/`` over the dataclasses of bench/spec/schema.py and of each strategy's module
(registered in the ConfigStore: a strategy's schema is its config group option, so its defaults
live in one place), so an unknown key or a wrong type fails at composition.  ``validate`` then
applies every cross-field rule and returns a :class:`Plan`: the shared rules here, the layout
rules of strategies that split the model, then the strategy's own (``StrategySpec.rules``).
With ``tuning=best`` it first applies the strategy's profile (bench/run/tuning_profiles.py).  Errors name the
key, the value and what would be valid, and are raised before any process is spawned.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Iterable, Optional

from omegaconf import DictConfig, OmegaConf

from bench.parallel.cp import NO_CPU
from bench.run import grad_reduce
from bench.machine.allocator import check as check_allocator
from bench.machine.hardware import HardwareConfig, check as check_hardware, preset_nodes
from bench.machine.hardware_rules import compute_capability, cuda_device_count, planned_device_name, planned_gpus
from bench.models.hf_config import resolve_model
from bench.spec.layout_rules import build as build_layout
from bench.metrics.loggers import check as check_logger
from bench.models.model_spec import describe_model
from bench.spec.schema import (BenchConfig, ConfigError, LoggerConfig, ModelConfig, Plan, check_choice, check_positive,
                              fields_of, typed)
from bench.strategies.registry import StrategySpec, get_spec, specs


def _alias(key: str, default: Any, *, _root_) -> Any:
    """``${bench_alias:zero_stage,0}``: the top-level shorthand's value when set, else the default."""
    v = _root_.get(key)
    return default if v is None else v


def register_configs() -> None:
    """Register the schemas (a strategy's schema is its group option) and the shorthand resolver."""
    from hydra.core.config_store import ConfigStore

    if not OmegaConf.has_resolver("bench_alias"):
        OmegaConf.register_new_resolver("bench_alias", _alias)
    cs = ConfigStore.instance()
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
    for name, spec in specs().items():
        cs.store(group="strategy", name=name, node=spec.schema)
    for name, node in preset_nodes().items():
        cs.store(group="hardware", name=name, node=node)


def strategy_spec(c: dict) -> StrategySpec:
    name = (c.get("strategy") or {}).get("name")
    if name not in specs():
        raise ConfigError("strategy", name, f"valid: {', '.join(specs())}")
    return get_spec(name)


def _apply_shorthands(c: dict, spec: StrategySpec) -> dict:
    """Top-level shorthands (``zero_stage=3``, ``microbatches=p``) set their strategy key (the schema's
    default interpolates them); a shorthand the strategy has no key for, or that an explicit strategy.<key>
    contradicts, is an error.  The plan's config keeps only the strategy key: what ran, said once."""
    c = dict(c)
    for name, f in fields_of(BenchConfig).items():
        target = f.metadata.get("alias")
        if not target or name not in c:
            continue
        v = c.pop(name)
        if v is None:
            continue
        leaf = target.split(".", 1)[1]
        s = c["strategy"]
        if leaf not in s:
            has = [n for n, sp in specs().items() if leaf in fields_of(sp.schema)]
            raise ConfigError(name, v, f"sets {target}, which strategy={s['name']} does not have; it applies to "
                              f"strategy={'|'.join(has)}")
        if s[leaf] != v:
            raise ConfigError(target, s[leaf], f"contradicts the shorthand {name}={v}; set only one of them")
    return c


def _check_known_keys(values: dict, schema: type, prefix: str = "") -> None:
    """Every key of a composed section must be a field bench reads: ``+strategy.zero_stag=2`` (a typo Hydra's
    ``+`` adds anyway) would otherwise run with the default and record the unused key as if it had applied.
    Free-form dicts (``vars``, ``strategy.ds_config``) take any key."""
    import dataclasses

    fields = fields_of(schema)
    for k, v in values.items():
        if k == "_command" and not prefix:
            continue
        f = fields.get(k)
        if f is None:
            raise ConfigError(prefix + k, v, f"bench does not use this key, so it would change nothing; "
                              f"valid keys here: {', '.join(fields)}")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default) and isinstance(v, dict):
            _check_known_keys(v, type(default), prefix + k + ".")


def _check_choices(c: dict, spec: StrategySpec) -> None:
    """Every knob declared with ``choices`` (bench/spec/schema.py knob), in every section."""
    from bench.spec.schema import FaultConfig, MetricsConfig

    sections = [("", BenchConfig, c), ("model.", ModelConfig, c["model"]), ("metrics.", MetricsConfig, c["metrics"]),
                ("fault.", FaultConfig, c["fault"]), ("logger.", LoggerConfig, c.get("logger") or {}),
                ("strategy.", spec.schema, c["strategy"])]
    for prefix, schema, values in sections:
        for name, f in fields_of(schema).items():
            valid = f.metadata.get("choices")
            if valid and name in values:
                check_choice(prefix + name, values[name], valid)


def run_config(cfg: DictConfig | dict, explicit: Iterable[str] = ()) -> dict:
    """The composed config as every entry reads it (a run, the planner, a sweep's job): a plain dict, the model
    resolved once from its preset or Hugging Face config (model.hf_config read in: the plan, the prediction and
    the run see the same model), the hardware section present.  Idempotent: a resolved config comes back as is."""
    c = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    c.setdefault("hardware", {"name": "auto"})
    _check_known_keys(c["model"], ModelConfig, "model.")
    c["model"] = resolve_model(c["model"], tuple(explicit))
    return c


def validate(cfg: DictConfig | dict, gpus: Optional[int] = None, explicit: Iterable[str] = ()) -> Plan:
    """Check every rule; return the Plan or raise ConfigError.

    ``gpus``: visible CUDA devices (looked up when None).  ``explicit``: the dotted keys the user set
    (command line, sweep); with tuning=best they win over the profile."""
    explicit = tuple(explicit)
    c = run_config(cfg, explicit)
    spec = strategy_spec(c)
    top = {k: v for k, v in c.items() if k not in ("model", "strategy", "hardware")}
    _check_known_keys(top, BenchConfig)
    _check_known_keys(c["hardware"], HardwareConfig, "hardware.")
    check_hardware(c["hardware"])
    _check_known_keys(c["strategy"], spec.schema, "strategy.")
    _check_choices(c, spec)
    c, explicit, reduction = grad_reduce.apply(c, spec, explicit)
    c = _apply_shorthands(c, spec)
    gpus = cuda_device_count() if gpus is None else gpus
    try:
        if c.get("tuning", "default") == "default":
            return _validate(c, spec, gpus)
        from bench.run.tuning_profiles import apply_profile

        # each trial is checked on a copy: a setting such as micro_batch_size=auto stays what was set until the end
        c, record = apply_profile(c, spec, lambda trial: _validate(copy.deepcopy(trial), spec, gpus), explicit,
                                  device=planned_device_name(c, gpus))
        plan = _validate(c, spec, gpus)
        plan.tuning = record
        return plan
    except ConfigError as e:  # a strategy's refusal of the knob grad_reduce set: said as grad_reduce's
        if reduction and e.key == reduction[0]:
            raise grad_reduce.explain(e, reduction) from e
        raise


def _validate(c: dict, spec: StrategySpec, gpus: int) -> Plan:
    _check_choices(c, spec)
    _shared_rules(c)
    device = _device(c, gpus)
    plan = _layout(c, spec, device)
    _float8_rules(plan, spec)
    if plan.layout.loss_chunks > 1 and not spec.loss_chunks:
        able = "|".join(n for n, sp in specs().items() if sp.loss_chunks)
        raise ConfigError("loss_chunks", plan.layout.loss_chunks, f"strategy={spec.name} computes its own loss; the "
                          f"chunked loss runs with strategy={able}; use loss_chunks=1")
    spec.rules(plan)
    return plan


def _shared_rules(c: dict) -> None:
    m = c["model"]
    for key in ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size", "seq_len", "global_batch"):
        check_positive(f"model.{key}", m[key])
    if m["d_model"] % m["n_heads"]:
        raise ConfigError("model.n_heads", m["n_heads"], f"must divide model.d_model={m['d_model']} (a model of "
                          "your own: docs/models.md, a preset in a --config-dir folder)")
    kv, desc = m.get("n_kv_heads"), describe_model(typed(ModelConfig, m))
    if kv is not None:
        check_positive("model.n_kv_heads", kv)
        if m["n_heads"] % kv:
            raise ConfigError("model.n_kv_heads", kv, f"must divide model.n_heads={m['n_heads']} (each key/value "
                              "head serves n_heads / n_kv_heads query heads)")
        if not desc.grouped_query and kv != m["n_heads"]:
            raise ConfigError("model.n_kv_heads", kv, "grouped-query attention is part of model.arch=llama; use "
                              "model.arch=llama, or n_kv_heads=null with arch=gpt")
    if desc.rotary and desc.head_dim % 2:
        raise ConfigError("model.n_heads", m["n_heads"], f"rotary embeddings need an even head dimension "
                          f"(model.d_model / n_heads = {m['d_model'] // m['n_heads']})")
    for key in ("rope_theta", "norm_eps"):
        if m.get(key, 1.0) <= 0:
            raise ConfigError(f"model.{key}", m[key], "must be positive")
    check_positive("world_size", c["world_size"])
    check_positive("steps", c["steps"])
    if c["cpu_affinity"] == "split" and not hasattr(os, "sched_setaffinity"):
        raise ConfigError("cpu_affinity", "split", "pinning ranks to CPUs needs Linux (os.sched_setaffinity); "
                          "use cpu_affinity=none")
    if c["run_timeout_s"] is not None and c["run_timeout_s"] <= 0:
        raise ConfigError("run_timeout_s", c["run_timeout_s"], "must be a positive number of seconds or null")
    check_positive("teardown_timeout_s", c["teardown_timeout_s"])
    if c["warmup_steps"] < 0 or c["warmup_steps"] >= c["steps"]:
        raise ConfigError("warmup_steps", c["warmup_steps"],
                          f"must be >= 0 and < steps={c['steps']} (at least one timed step)")
    if not 0 <= c["metrics"]["profile_steps"] <= c["steps"]:
        raise ConfigError("metrics.profile_steps", c["metrics"]["profile_steps"],
                          f"must be 0 (off) .. steps={c['steps']} (the last k steps are re-run under the profiler)")
    if c["compile_mode"] != "default" and not c["compile"]:
        raise ConfigError("compile_mode", c["compile_mode"], "takes effect only with compile=true; add compile=true "
                          "or leave compile_mode=default")
    check_logger(c.get("logger"))
    if c.get("memory_gib") is not None and c["memory_gib"] <= 0:
        raise ConfigError("memory_gib", c["memory_gib"], "must be a positive number of GiB or null")


def _device(c: dict, gpus: int) -> str:
    device = c["device"]
    gpus = planned_gpus(c, gpus)  # hardware=: planned here, for a dry run, or for the job being submitted
    if device == "auto":
        device = "cuda" if gpus > 0 else "cpu"
    if device == "cuda" and gpus == 0:
        raise ConfigError("device", "cuda", "no CUDA device is visible; use device=cpu or device=auto")
    if device == "cuda" and c["world_size"] > gpus:
        raise ConfigError("world_size", c["world_size"],
                          f"only {gpus} CUDA device(s) visible on this node; use world_size<={gpus} "
                          "(or hydra/launcher=slurm for several nodes)")
    check_allocator(c["allocator"], device)
    if c["precision"] == "auto":  # resolved here, so the run's record and key say what ran
        c["precision"] = "bf16" if device == "cuda" else "fp32"
    if device == "cpu" and c["precision"] == "fp16":
        raise ConfigError("precision", "fp16", "fp16 needs a GPU; on CPU use fp32 or bf16")
    if device == "cpu" and c["strategy"].get("cp", 1) > 1:
        raise ConfigError("strategy.cp", c["strategy"]["cp"], f"{NO_CPU}; use strategy.cp=1 on CPU, or plan it on a "
                          "GPU you name: dry_run=true hardware=<preset>")
    if device == "cpu" and c["compile"] and c["compile_mode"] == "reduce-overhead":
        raise ConfigError("compile_mode", "reduce-overhead", "captures CUDA graphs, which need a GPU; on CPU use "
                          "compile_mode=default")
    return device


def describe_run(c: dict, spec: Optional[StrategySpec] = None) -> BenchConfig:
    """The typed run description of a resolved config (plain containers): every section its schema's dataclass
    (the strategy's own schema, the hardware's), a key the config lacks at its schema default.  Built here once;
    everything downstream reads its attributes."""
    spec = spec or strategy_spec(c)
    return typed(BenchConfig, c, {"model": ModelConfig, "strategy": spec.schema, "hardware": HardwareConfig})


def plan_from_dict(d: dict) -> Plan:
    """A Plan from its plain containers (Plan.to_dict, as the ranks receive it), its run description typed again."""
    from bench.spec.layout import Layout

    run = {k: v for k, v in d["run"].items() if k != "_command"}
    return Plan(**{**d, "run": describe_run(run), "layout": Layout(**d["layout"])})


def _layout(c: dict, spec: StrategySpec, device: str) -> Plan:
    """The plan around its layout (bench/spec/layout_rules.py builds and checks it), micro_batch_size=auto chosen."""
    run = describe_run(c, spec)
    plan = Plan(run=run, device=device, backend="nccl" if device == "cuda" else "gloo",
                world_size=c["world_size"], layout=build_layout(run), command=c.get("_command"))
    if c["strategy"].get("micro_batch_size") == "auto":
        _auto_micro_batch(plan, plan.layout.per_rank_batch, spec)
    return plan


def _auto_micro_batch(plan: Plan, per_rank: int, spec: StrategySpec) -> None:
    """``strategy.micro_batch_size=auto``: the largest divisor of the per-rank batch whose memory plan fits the
    device (the visible GPU, the hardware preset or memory_gib) outside the plan's error margin (not tight),
    else the largest that fits at all, else 1; the rest of the per-rank batch by gradient accumulation.  A
    micro-batch the strategy's rules refuse (CUDA graphs across accumulated micro-batches, say) is passed over,
    unless they refuse every one (then validation names the cause).  With no device memory to plan against (a CPU
    run without memory_gib) the whole per-rank batch, as null.  The choice goes into the config (the run key says
    what ran) and plan.micro_batch_auto (why)."""
    from bench.plan.memory_model import memory_plan

    tried, chosen, why = [], None, None
    sizes = sorted((d for d in range(1, per_rank + 1) if per_rank % d == 0), reverse=True)
    refused = {b: _refusal(spec, _with_micro_batch(plan, b)) for b in sizes}
    if all(refused.values()):
        refused = dict.fromkeys(sizes)
    for b in sizes:
        mem = memory_plan(_with_micro_batch(plan, b))
        if mem["fits"] is None:
            chosen, why = per_rank, (f"no device memory to plan against ({mem['device_memory_source']}): the whole "
                                     "per-rank batch, one micro-batch (as null); set memory_gib or hardware= to choose")
            break
        tried.append({"micro_batch_size": b, "needed_gib": round(mem["needed_mb"] / 1024, 1), "fits": mem["fits"],
                      "tight": mem["tight"], **({"refused": refused[b]} if refused[b] else {})})
        if mem["fits"] and not mem["tight"] and not refused[b]:
            chosen, why = b, f"the largest that fits {mem['device_memory_gib']:.1f} GiB ({mem['device_memory_source']})"
            break
    if chosen is None:
        fit = [t["micro_batch_size"] for t in tried if t["fits"] and not t.get("refused")]
        chosen, why = (fit[0], "the largest that fits, within the plan's error of the limit (tight: it may run out "
                       "of memory)") if fit else (1, "none fits: the smallest (the memory plan says it does not fit)")
    _with_micro_batch(plan, chosen)
    plan.micro_batch_auto = {"key": "strategy.micro_batch_size", "chosen": chosen, "grad_accum": per_rank // chosen,
                             "per_rank_batch": per_rank, "reason": why, "tried": tried}


def _with_micro_batch(plan: Plan, b: int) -> Plan:
    plan.layout = plan.layout.with_micro_batch(b)
    plan.strategy.micro_batch_size = b
    return plan


def _refusal(spec: StrategySpec, plan: Plan) -> Optional[str]:
    """What the strategy's rules say against a plan (None: nothing)."""
    try:
        spec.rules(plan)
    except ConfigError as e:
        return str(e)
    return None


# --------------------------------------------------------------------------- precision=fp8
FLOAT8_MIN_CC = 8.9  # float8 tensor cores: Ada (8.9), Hopper (9.0) and later


def _float8_rules(plan: Plan, spec: StrategySpec) -> None:
    """precision=fp8 (torchao's float8 training, bench/parallel/float8.py): its recipe only with it, a strategy
    whose implementation composes with torchao (StrategySpec.float8), a GPU with float8 tensor cores, and
    compile=true: torchao's float8 is fast only compiled (eager, its scaling and casts are separate kernels
    that make it slower than bf16), so an eager fp8 run is refused rather than recorded as float8's speed."""
    # read typed: plan.cfg, a deep copy (a probe profile's curves too), made this the slowest rule of a planner search
    r = plan.run
    if r.precision != "fp8":
        if r.fp8_recipe != "tensorwise":
            raise ConfigError("fp8_recipe", r.fp8_recipe, "takes effect only with precision=fp8; add precision=fp8 "
                              "or leave fp8_recipe=tensorwise")
        return
    if not spec.float8:
        able = [n for n, sp in specs().items() if sp.float8]
        raise ConfigError("strategy", spec.name, f"cannot run precision=fp8: torchao's float8 composes with the "
                          f"torch-native strategies ({'|'.join(able)}); strategy={_float8_alternative(plan.cfg, able)} "
                          "precision=fp8 runs")
    if plan.device != "cuda":
        raise ConfigError("precision", "fp8", "needs a GPU with float8 tensor cores (compute capability >= "
                          f"{FLOAT8_MIN_CC}: H100, H200, L40S) and this run is on the CPU; use precision=bf16 (or "
                          "fp32) here, or plan for such a GPU with dry_run=true hardware=h100_sxm_80gb")
    cc, where = compute_capability(plan.run)
    if cc is not None and cc < FLOAT8_MIN_CC:
        raise ConfigError("precision", "fp8", f"needs float8 tensor cores (compute capability >= {FLOAT8_MIN_CC}: "
                          f"H100, H200, L40S), and {where} has {cc}; use precision=bf16")
    if not r.compile:
        raise ConfigError("compile", False, "with precision=fp8: torchao's float8 is fast only compiled (eager, its "
                          "scaling and casts are separate kernels, slower than bf16); add compile=true")


def _float8_alternative(c: dict, able: list[str]) -> str:
    """The fp8-capable strategy to suggest: the first whose default knobs shard the model states (as the
    refused ones, ZeRO and Megatron's distributed optimizer, do), else the first."""
    import dataclasses

    for name in able:
        spec = get_spec(name)
        try:
            if spec.model_states(describe_run({**c, "strategy": dataclasses.asdict(spec.schema())}, spec)).stage >= 1:
                return name
        except (KeyError, TypeError, ValueError):  # a strategy whose states need more than its defaults say
            continue
    return able[0]

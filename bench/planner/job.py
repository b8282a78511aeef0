"""The user's question as the planner reads it: its own keys (nodes, tokens per step, ...) and every bench key,
composed by Hydra from conf/ (so ``model=...``, ``hardware=...``, ``model.seq_len=...`` work as for a run)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from bench.machine.hardware import resolve as resolve_hardware
from bench.plan.link_terms import regime_mismatch
from bench.spec.commands import override_key
from bench.spec.schema import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf"
SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30,
          "ti": 2**40}
OPTIONS = ("nodes", "gpus_per_node", "tokens_per_step", "train_tokens", "memory_budget_gib", "measure_top",
           "measure_with", "top", "out")


@dataclass
class Question:
    """What the user asked (``python -m bench.planner`` keys) and the bench overrides they gave."""

    overrides: list[str]
    nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None
    tokens_per_step: Optional[float] = None
    train_tokens: Optional[float] = None
    memory_budget_gib: Optional[float] = None
    measure_top: int = 0
    measure_with: list[str] = field(default_factory=list)
    top: int = 20
    out: Optional[str] = None
    config_dirs: list[str] = field(default_factory=list)  # ``--config-dir DIR``: presets and probe profiles of yours
    help: bool = False

    def bench_flags(self) -> list[str]:
        """The flags ``python -m bench`` needs to see what the planner saw (``--config-dir DIR``)."""
        return [a for d in self.config_dirs for a in ("--config-dir", d)]


def amount(key: str, value: str) -> float:
    """``1e12``, ``1T``, ``1M`` (10^6), ``1Mi`` (2^20), ``4096``: a positive number."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmbgt]i?)?\s*", value.lower())
    if not m or (m.group(2) or "") not in SUFFIX:
        raise ConfigError(key, value, "must be a positive number, e.g. 1e12, 1T, 1M (10^6), 1Mi (2^20)")
    x = float(m.group(1)) * SUFFIX[m.group(2) or ""]
    if x <= 0:
        raise ConfigError(key, value, "must be positive")
    return x


def _positive_int(key: str, value: str, least: int = 1) -> int:
    if not re.fullmatch(r"-?[0-9]+", value) or int(value) < least:
        raise ConfigError(key, int(value) if re.fullmatch(r"-?[0-9]+", value) else value,
                          f"must be an integer >= {least}")
    return int(value)


CONFIG_DIR_FLAGS = ("--config-dir", "-cd")
HELP_FLAGS = ("--help", "-h")


def parse(argv: list[str]) -> Question:
    """Split the command line into the planner's keys (checked, one line naming a bad one), the flags
    ``python -m bench`` takes that a plan needs (``--config-dir``, ``--help``) and bench overrides."""
    q = Question(overrides=[])
    args = iter(argv)
    for arg in args:
        flag, eq_, given = arg.partition("=")
        if flag in CONFIG_DIR_FLAGS:
            folder = given if eq_ else next(args, None)
            if not folder or not Path(folder).expanduser().is_dir():
                raise ConfigError(flag, folder, "needs a folder that exists (a config dir holding hardware/<name>.yaml "
                                  "or model/<name>.yaml, as python -m bench --config-dir takes)")
            q.config_dirs.append(str(Path(folder).expanduser().resolve()))
            continue
        if flag in HELP_FLAGS:
            q.help = True
            continue
        if arg.startswith("-"):
            raise ConfigError(flag, given or None, f"is not a planner flag: valid: {', '.join(CONFIG_DIR_FLAGS)} DIR, "
                              f"{', '.join(HELP_FLAGS)}; everything else is key=value")
        key, eq, value = arg.partition("=")
        if key not in OPTIONS:
            q.overrides.append(arg)
            continue
        if not eq:
            raise ConfigError(key, None, "needs a value (key=value)")
        if key in ("nodes", "gpus_per_node", "top"):
            setattr(q, key, _positive_int(key, value))
        elif key == "measure_top":
            q.measure_top = _positive_int(key, value, 0)
        elif key in ("tokens_per_step", "train_tokens", "memory_budget_gib"):
            setattr(q, key, amount(key, value))
        elif key == "measure_with":
            q.measure_with = [v for v in value.strip("[]").split(",") if v]
        else:
            q.out = value
    return q


def compose(overrides: list[str], config_dirs: Iterable[str] = ()) -> dict:
    """conf/config.yaml with the overrides (and the user's config dirs), as ``python -m bench`` composes it: a plain
    dict with the model resolved once (bench/run/config.py run_config: a Hugging Face config read in)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from bench.run.config import register_configs, run_config

    register_configs()
    extra = [f"hydra.searchpath=[{','.join('file://' + d for d in config_dirs)}]"] if config_dirs else []
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3", job_name="planner"):
        cfg = hydra_compose(config_name="config", overrides=[*extra, *overrides])
    return run_config(cfg, [override_key(o) for o in overrides])


def job_overrides(q: Question, cfg: dict) -> tuple[list[str], dict]:
    """(the overrides that size the job: world size, global batch, GPUs per node, memory budget; what they mean)."""
    hw = resolve_hardware(cfg)
    if hw is None or not hw.peak_tflops:
        raise ConfigError("hardware", (cfg.get("hardware") or {}).get("name"), "the planner predicts for a GPU: name "
                          "one (hardware=h100_sxm_80gb, a100_80gb, ...; bench/machine/hardware.py) or describe yours")
    mismatch = regime_mismatch(cfg.get("link_regime"), hw)  # it ranks by predicted speed: none can be made
    if mismatch:
        raise ConfigError("link_regime", cfg["link_regime"], mismatch)
    per_node = q.gpus_per_node or hw.gpus_per_node or 8
    set_ws = any(override_key(o) == "world_size" for o in q.overrides)
    ws = q.nodes * per_node if q.nodes else (cfg["world_size"] if set_ws else per_node)
    seq = cfg["model"]["seq_len"]
    gb, note = cfg["model"]["global_batch"], "model.global_batch as composed"
    if q.tokens_per_step:
        exact = q.tokens_per_step / seq
        gb = round(exact) if exact == round(exact) else max(ws, ws * round(exact / ws))
        note = (f"tokens_per_step={q.tokens_per_step:,.0f} / model.seq_len={seq}" if exact == round(exact) else
                f"tokens_per_step={q.tokens_per_step:,.0f} is {exact:.2f} sequences of {seq}: rounded to {gb}, a "
                f"multiple of world_size={ws} (every data-parallel size divides it)")
    out = [f"world_size={ws}", f"model.global_batch={gb}"]
    if per_node != hw.gpus_per_node:
        out.append(f"hardware.gpus_per_node={per_node}")
    if q.memory_budget_gib:
        out.append(f"memory_gib={min(q.memory_budget_gib, hw.memory_gib or q.memory_budget_gib):g}")
    facts = {"hardware": hw.name, "gpu": hw.gpu, "gpus_per_node": per_node, "world_size": ws,
             "nodes": -(-ws // per_node), "global_batch": gb, "seq_len": seq, "tokens_per_step": gb * seq,
             "global_batch_from": note, "memory_gib": hw.memory_gib, "memory_budget_gib": q.memory_budget_gib}
    return out, facts


def common_overrides(q: Question, sizing: list[str]) -> list[str]:
    """The user's bench overrides (those the sizing replaces left out), then the sizing, then the settings
    tuning=best gives every strategy (the CUDA allocator: tuning_profiles.EVERY_STRATEGY) the user did not set."""
    from bench.run.tuning_profiles import EVERY_STRATEGY

    replaced = {override_key(o) for o in sizing}
    own = [o for o in q.overrides if override_key(o) not in replaced]
    mine = {override_key(o) for o in own}
    return own + sizing + [f"{k}={v}" for k, (v, _) in EVERY_STRATEGY.items() if k not in mine]

"""``tuning=best``: apply a strategy's profile of best measured settings, honestly.

Each strategy declares its profile in its module (``StrategySpec.profiles["best"]``): dotted keys
(or groups of keys that only work together, e.g. compile + compile_mode) with the value measured
fastest and the evidence (a results/ folder).  Applied in order, each entry is:

* ``kept`` when the user set that key (command line, sweep, preset: an explicit override, or a value
  that differs from the schema default): what was asked for wins;
* ``skipped`` when the run would not validate with it (a CUDA-only knob on CPU, a ZeRO-3-only knob at
  stage 1, ``compute_grad_norm=false`` with clipping, ...): the validation message is the reason; or
  when the entry's own condition says the measurement does not hold for this layout (an optional third
  element, ``unless(plan) -> reason or None`` over the validated layout: e.g. a distributed optimizer at
  data-parallel size 1);
* ``applied`` otherwise.

None of the profile knobs changes what is trained (tests: tuning=best matches single's losses).
The record goes into metrics.json (``layout.tuning``) and the log; the run key covers the applied
settings, so a best-tuned run is never mistaken for a default one.
"""
from __future__ import annotations

import copy
from dataclasses import MISSING
from typing import Any, Callable, Iterable

from bench.schema import BenchConfig, ConfigError, fields_of


def _get(c: dict, key: str) -> Any:
    node = c
    for part in key.split("."):
        node = node[part]
    return node


def _set(c: dict, key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = c
    for part in parents:
        node = node[part]
    node[leaf] = value


def _default_of(key: str, strategy_schema: type) -> Any:
    section, _, leaf = key.rpartition(".")
    schema = {"": BenchConfig, "strategy": strategy_schema}.get(section)
    f = fields_of(schema).get(leaf) if schema else None
    if f is None:
        return MISSING
    if isinstance(f.default, str) and f.default.startswith("${bench_alias:"):  # a shorthand's interpolation
        return MISSING
    return f.default if f.default is not MISSING else MISSING


def apply_profile(c: dict, spec, check: Callable[[dict], Any], explicit: Iterable[str] = ()) -> tuple[dict, dict]:
    """(config with the profile applied, record); ``check(config)`` returns its Plan or raises ConfigError
    when it cannot run."""
    name = c.get("tuning", "default")
    profile = spec.profiles.get(name)
    if profile is None:
        raise ConfigError("tuning", name, f"strategy={spec.name} has no {name!r} profile; valid: "
                          f"default, {', '.join(spec.profiles) or '(none)'}")
    explicit = set(explicit)
    record: dict = {"profile": name, "applied": {}, "kept": {}, "skipped": {}}
    out = copy.deepcopy(c)
    for keys, (values, evidence, *unless) in profile.items():
        keys = keys if isinstance(keys, tuple) else (keys,)
        values = values if len(keys) > 1 else (values,)
        mine = [k for k in keys if k in explicit or _default_of(k, spec.schema) not in (MISSING, _get(out, k))]
        if mine:
            for k in keys:
                record["kept"][k] = {"value": _get(out, k), "profile": values[keys.index(k)],
                                     "reason": f"set explicitly ({', '.join(mine)})"}
            continue
        trial = copy.deepcopy(out)
        for k, v in zip(keys, values):
            _set(trial, k, v)
        try:
            plan = check(trial)
            why_not = unless[0](plan) if unless else None
        except ConfigError as e:
            why_not = str(e)
        if why_not:
            for k, v in zip(keys, values):
                record["skipped"][k] = {"value": v, "reason": why_not}
            continue
        out = trial
        for k, v in zip(keys, values):
            record["applied"][k] = {"value": v, "evidence": evidence}
    def settings(part: str) -> str:
        return ", ".join(f"{k}={v['value']}" for k, v in record[part].items())

    parts = [f"applied {settings('applied') or 'nothing'}"]
    if record["kept"]:
        parts.append(f"kept as set {settings('kept')}")
    if record["skipped"]:
        parts.append("skipped " + "; ".join(f"{k}={v['value']} ({v['reason']})" for k, v in record["skipped"].items()))
    if not profile:
        parts = [f"strategy={spec.name}'s defaults are its best measured settings: nothing to apply"]
    record["summary"] = "; ".join(parts)
    return out, record

"""``tuning=best``: apply a strategy's profile of best measured settings, honestly.

Each strategy declares its profile in its module (``StrategySpec.profiles["best"]``): dotted keys
(or groups of keys that only work together) with the value measured
fastest and the evidence (a results/ folder); ``EVERY_STRATEGY``'s entries (the CUDA allocator) follow it.  Applied in order, each entry is:

* ``kept`` when the user set that key (command line, sweep, preset: an explicit override, or a value
  that differs from the schema default): what was asked for wins;
* ``skipped`` when the run would not validate with it (a CUDA-only knob on CPU, a ZeRO-3-only knob at
  stage 1, ``compute_grad_norm=false`` with clipping, ...): the validation message is the reason; or
  when the entry's own condition says the measurement does not hold for this layout (an optional third
  element, ``unless(plan) -> reason or None`` over the validated layout: e.g. a distributed optimizer at
  data-parallel size 1);
* ``skipped`` when the memory plan predicts an out-of-memory with it, or a plan too close to the limit to tell
  ("tight"), and one that fits without it (never worse for memory: the plan's numbers are the reason);
* ``applied`` otherwise.

Which settings: with ``tuning=best`` the nearest measured workload's (bench/plan/bests.py: a knob search's
winner on this device type, near enough), else the static profile, and the record says which and how
near.  Unless the user set the micro-batch (or strategy.microbatches), ``strategy.micro_batch_size=auto``
comes first (the largest the memory plan fits), so every later setting is checked at the micro-batch it
leaves; with no device memory to plan against (CPU) it is left out, and the record says so.

None of the profile knobs changes what is trained (tests: tuning=best matches single's losses).
The record goes into metrics.json (``layout.tuning``) and the log; the run key covers the applied
settings, so a best-tuned run is never mistaken for a default one.
"""
from __future__ import annotations

import copy
from dataclasses import MISSING
from typing import Any, Callable, Iterable, Optional

from bench.spec.schema import BenchConfig, ConfigError, fields_of

MICRO_BATCH = "strategy.micro_batch_size"
# tuning=best's entries for every strategy, after its own profile (the measured bests store knobs per strategy)
EVERY_STRATEGY = {
    "allocator": ("expandable_segments", "4 x H100, Llama-3 8B FSDP2 cp=4 at 8k: out of memory with 14.8 GiB "
                  "reserved but unallocated under the default allocator, completed with expandable segments; the "
                  "same tokens/s where memory is not short (39,177 vs 39,214) "
                  "(results/2026-11-28-h100x4-expandable-segments)"),
}


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


def apply_profile(c: dict, spec, check: Callable[[dict], Any], explicit: Iterable[str] = (),
                  device: Optional[str] = None) -> tuple[dict, dict]:
    """(config with the profile applied, record); ``check(config)`` returns its Plan or raises ConfigError
    when it cannot run; ``device``: the GPU's name (nvidia-smi's), None on CPU (no measured bests then)."""
    name = c.get("tuning", "default")
    explicit = set(explicit)
    out = copy.deepcopy(c)
    base = _plan_or_none(check, out)
    profile, source = _choose(out, spec, base, device) if name == "best" else (spec.profiles.get(name), None)
    if profile is None:
        raise ConfigError("tuning", name, f"strategy={spec.name} has no {name!r} profile; valid: "
                          f"default, {', '.join(spec.profiles) or '(none)'}")
    record: dict = {"profile": name, "source": source, "applied": {}, "kept": {}, "skipped": {}}
    entries = (_micro_batch_entry(out, base, explicit, record) if name == "best" else []) + list(profile.items()) \
        + (list(EVERY_STRATEGY.items()) if name == "best" else [])
    mem = _memory(base)
    for keys, (values, evidence, *unless) in entries:
        out, mem = _apply_one(out, mem, keys, values, evidence, unless, spec, check, explicit, record)
    record["summary"] = _summary(record, spec, bool(entries))
    return out, record


def _plan_or_none(check: Callable[[dict], Any], c: dict) -> Any:
    try:
        return check(c)
    except ConfigError:  # the run cannot validate as set: validate() says why after the profile
        return None


def _choose(c: dict, spec, base: Any, device: Optional[str]) -> tuple[Optional[dict], dict]:
    """The settings tuning=best applies: the nearest measured workload's when it is near (bench/plan/bests.py),
    else the static profile; with the record of which and how near."""
    from bench.plan import bests

    static = spec.profiles.get("best")

    def fallback(why: str) -> tuple[Optional[dict], dict]:
        return static, {"kind": "static", "reason": f"{why}: the static profile (StrategySpec.profiles['best'])"}

    if device is None:
        return fallback("no GPU to look up measured bests for (a CPU run)")
    if base is None:
        return fallback("this configuration does not validate as set")
    wl = bests.plan_workload(base, device)
    found = bests.nearest(spec, c["strategy"], wl)
    if found is None:
        return fallback(f"no measured best of this strategy on {device} or a GPU of its architecture")
    e, d = found["entry"], found["distance"]
    if d > bests.NEAR:
        return fallback(f"the nearest measured workload ({bests.describe(e)}) is at distance {d:.2f} > "
                        f"{bests.NEAR:g} (bench/plan/bests.py)")
    return bests.as_profile(e, spec, d), {
        "kind": "measured", "distance": d, "near": bests.NEAR, "distance_parts": found["parts"],
        "workload": e["workload"], "this_workload": wl, "strategy": e["strategy"],
        "tokens_per_s": e.get("tokens_per_s"),
        "peak_memory_mb": e.get("peak_memory_mb"), "source": e.get("source"), "command": e.get("command"),
        "store": found["origin"], "description": bests.describe(e)}


def _micro_batch_entry(c: dict, base: Any, explicit: set, record: dict) -> list:
    """micro_batch_size=auto as the first entry, unless the micro-batch is the user's (set, or set by
    strategy.microbatches) or there is no device memory to plan against (said in the record)."""
    from bench.plan.memory_model import device_memory_gib

    s = c["strategy"]
    if MICRO_BATCH in explicit or s.get("micro_batch_size") is not None or s.get("microbatches") is not None:
        return []
    gib, where = device_memory_gib(base) if base is not None else (None, "the configuration does not validate")
    if gib is None:
        record["micro_batch_size"] = f"not chosen by the memory plan ({where}): one micro-batch of the per-rank batch"
        return []
    return [(MICRO_BATCH, ("auto", f"the largest micro-batch the memory plan fits in {gib:.1f} GiB ({where})"))]


def _memory(plan: Any) -> Optional[tuple[dict, Optional[str]]]:
    """(memory plan, why it does not fit cleanly: an out-of-memory, or "tight"; None where it fits) of a plan;
    None without one."""
    from bench.plan.memory_model import fits, memory_plan

    if plan is None:
        return None
    mem = memory_plan(plan)
    return mem, fits(mem, plan) or ("tight" if mem.get("tight") else None)


def _worse(why: Optional[str]) -> int:
    """A memory verdict's order (_memory's second part): fits 0, tight 1, out of memory 2."""
    return 0 if why is None else 1 if why == "tight" else 2


def _apply_one(out: dict, mem: Any, keys, values, evidence: str, unless: list, spec, check: Callable[[dict], Any],
               explicit: set, record: dict) -> tuple[dict, Any]:
    """Apply one profile entry (keys that work together) to ``out`` or record why not (module docstring)."""
    keys = keys if isinstance(keys, tuple) else (keys,)
    values = values if len(keys) > 1 else (values,)
    mine = [k for k in keys if k in explicit or _default_of(k, spec.schema) not in (MISSING, _get(out, k))]
    if mine:
        for k in keys:
            record["kept"][k] = {"value": _get(out, k), "profile": values[keys.index(k)],
                                 "reason": f"set explicitly ({', '.join(mine)})"}
        return out, mem
    trial = copy.deepcopy(out)
    for k, v in zip(keys, values):
        _set(trial, k, v)
    new = None
    try:
        plan = check(trial)
        why_not = unless[0](plan) if unless else None
        new = None if why_not else _memory(plan)
        if not why_not and new and mem and _worse(new[1]) > _worse(mem[1]):  # never worse for memory
            worse = "is tight with it" if new[1] == "tight" else "predicts an out-of-memory with it"
            better = "tight" if mem[1] == "tight" else "fits"
            why_not = f"the memory plan {worse} ({new[0]['summary']}), and {better} without it ({mem[0]['summary']})"
    except ConfigError as e:
        why_not = str(e)
    if why_not:
        for k, v in zip(keys, values):
            record["skipped"][k] = {"value": v, "reason": why_not}
        return out, mem
    for k, v in zip(keys, values):
        record["applied"][k] = {"value": v, "evidence": evidence}
    return trial, new


SEARCH_EVIDENCE = "the planner's search: fits, fastest predicted"


def with_search(record: dict, spec, changes: dict) -> dict:
    """The record after the planner's search (bench/planner/resolve.py) chose ``changes`` on top of the profile: each
    setting the search set is applied with the search as its evidence (naming the profile's value where the search
    replaced it), so that the record and the log say neither "skipped" nor the profile's value of what runs."""
    out = {**record, "applied": dict(record["applied"]), "skipped": dict(record["skipped"])}
    for k, v in changes.items():
        if v is None:
            continue
        if k in out["skipped"] and out["skipped"][k]["value"] == v:
            del out["skipped"][k]
        before = out["applied"].get(k)
        if before is None:
            out["applied"][k] = {"value": v, "evidence": SEARCH_EVIDENCE}
        elif before["value"] != v:
            out["applied"][k] = {"value": v, "evidence": f"{SEARCH_EVIDENCE} (the profile's {k}={before['value']}: "
                                                         f"{before['evidence']})"}
    out["summary"] = _summary(out, spec, True)
    return out


def _summary(record: dict, spec, anything: bool) -> str:
    """One line for the log: where the settings came from, then what was applied, kept and skipped."""
    def settings(part: str) -> str:
        return ", ".join(f"{k}={v['value']}" for k, v in record[part].items())

    src = record.get("source") or {}
    parts = []
    if src.get("kind") == "measured":
        parts.append(f"from the measured best of {src['description']} ({src['tokens_per_s'] or 0:,.0f} tokens/s), "
                     f"distance {src['distance']:.2f} (near: <= {src['near']:g})")
    elif src:
        parts.append(src["reason"])
    if not anything:
        return "; ".join(parts + [f"strategy={spec.name}'s defaults are its best measured settings: nothing to apply"])
    parts.append(f"applied {settings('applied') or 'nothing'}")
    if record["kept"]:
        parts.append(f"kept as set {settings('kept')}")
    if record["skipped"]:
        parts.append("skipped " + "; ".join(f"{k}={v['value']} ({v['reason']})" for k, v in record["skipped"].items()))
    if record.get("micro_batch_size"):
        parts.append(f"micro_batch_size {record['micro_batch_size']}")
    return "; ".join(parts)

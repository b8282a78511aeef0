"""The store of measured bests: what ``tuning=best`` takes from the nearest measured workload.

Every knob search (bench/sweep/search.py) writes its winners as *entries*: the strategy (its identity:
its config section without the knobs a search tunes, so ZeRO-1 and ZeRO-3 are two), the settings (the
knob values where the winner differs from its search's base), tokens/s, peak memory, and the
*workload*: the device (as nvidia-smi names it), model architecture, parameters, world size, tokens per
rank per micro-batch (seq_len x the micro-batch the workload asks for: strategy.micro_batch_size or
strategy.microbatches when set, else the whole per-rank batch) and precision.

The store is two files: ``bench/plan/bests.json``, shipped, rebuilt from the searches recorded in results/ by
``python -m bench.plan.bests results/``; and the user's own, ``$BENCH_BESTS`` (default
``~/.cache/bench/bests.json``), where every search adds its winners (a winner of the same workload
replaces the earlier one).

The distance of two workloads of one strategy identity on one device type, or on a sibling (the same
architecture, by the hardware presets' compute capability, with other memory: H100 80GB and H200); another
architecture is never compared::

    d = |log2 P/P'| + |log2 T/T'| + |log2 W/W'| + [exactly one of W, W' is 1]
        + 0.5 [arch differs] + 2 [precision differs] + 0.5 [a sibling device]

(P parameters, T tokens per rank per micro-batch, W world size: one rank has no communication at all).
*Near* is d <= NEAR = 1: twice the parameters, or twice the tokens per micro-batch, or twice the ranks
(2 -> 4, not 1 -> 2), but not two of them; an architecture of its own costs half of it, another precision
is never near; a sibling device costs as much as another architecture (the same kernels run, memory size and
bandwidth differ: a setting that does not fit is still refused by the memory plan).  tuning=best applies
the nearest entry's settings when it is near, else the strategy's static profile (bench/run/tuning_profiles.py).  The micro-batch is not taken from an entry (a number of
sequences of another workload's batch): tuning=best uses micro_batch_size=auto.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import math
import os
import sys
from dataclasses import MISSING
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from bench.machine.hardware import match as match_hardware
from bench.jsonio import read_json_dict, write_json_atomic
from bench.spec.schema import BenchConfig, ModelConfig, fields_of, setting, typed
from bench.units import count_text

SHIPPED = Path(__file__).with_name("bests.json")
NEAR = 1.0
ARCH_COST, PRECISION_COST, ONE_RANK_COST, SIBLING_COST = 0.5, 2.0, 1.0, 0.5
MICRO_BATCH = "strategy.micro_batch_size"


def user_store() -> Path:
    """The user's store: $BENCH_BESTS, else <cache folder>/bench/bests.json."""
    if os.environ.get("BENCH_BESTS"):
        return Path(os.environ["BENCH_BESTS"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "bench" / "bests.json"


def read_entries(path: Path) -> list[dict]:
    d = read_json_dict(path) or {}
    return [e for e in d.get("entries") or [] if isinstance(e, dict) and e.get("workload")]


def load() -> list[tuple[str, dict]]:
    """(origin, entry) of the user's entries, then the shipped ones."""
    return [("user", e) for e in read_entries(user_store())] + [("shipped", e) for e in read_entries(SHIPPED)]


# ------------------------------------------------------------------------------ what an entry holds
def settings_keys(spec) -> set[str]:
    """The dotted keys an entry's settings may hold: every knob with search candidates and every key of the
    strategy's static profile; not the micro-batch (tuning=best chooses it with auto)."""
    keys = {n for n, f in fields_of(BenchConfig).items() if f.metadata.get("tune")}
    keys |= {f"strategy.{n}" for n, f in fields_of(spec.schema).items() if f.metadata.get("tune")}
    for k in spec.profiles.get("best") or {}:
        keys |= set(k if isinstance(k, tuple) else (k,))
    return keys - {MICRO_BATCH}


def _default(f) -> Any:
    """A schema field's default as a composed config holds it (a nested dataclass as a dict)."""
    d = f.default if f.default_factory is MISSING else f.default_factory()
    if dataclasses.is_dataclass(d):
        return dataclasses.asdict(d)
    return None if d is MISSING or (isinstance(d, str) and d.startswith("${")) else d


def identity(spec, strategy: dict) -> dict:
    """The strategy section without the knobs a search tunes (nor the micro-batch), with the schema's
    defaults for keys a recorded config lacks and without keys the schema no longer has."""
    tuned = settings_keys(spec) | {MICRO_BATCH}
    return {n: strategy.get(n, _default(f)) for n, f in fields_of(spec.schema).items() if f"strategy.{n}" not in tuned}


def stored_identity(spec, strategy: dict) -> dict:
    """The identity as an entry stores it: the name and what differs from the schema's defaults (a key the
    schema gains later leaves the stored entries as they are)."""
    fields = fields_of(spec.schema)
    return {"name": spec.name, **{k: v for k, v in identity(spec, strategy).items() if v != _default(fields[k])}}


def workload(run: BenchConfig, device: Optional[str], dp: int, micro_batch: int, fixed: bool) -> dict:
    """A run's workload (module docstring); ``fixed``: its micro-batch was set (else the whole per-rank batch)."""
    from bench.metrics.flops import total_params

    m = run.model
    asked = micro_batch if fixed or getattr(run.strategy, "microbatches", None) is not None else m.global_batch // dp
    return {"device": device or "cpu", "model": m.name, "arch": m.arch,
            "parameters": int(total_params(m)), "world_size": run.world_size,
            "tokens_per_microbatch": int(asked * m.seq_len), "precision": run.precision}


def plan_workload(plan, device: Optional[str]) -> dict:
    """The workload of a validated plan (tuning=best's lookup)."""
    mbs = plan.strategy.micro_batch_size
    return workload(plan.run, device, plan.dp_size, plan.micro_batch_size, isinstance(mbs, int)
                    and not isinstance(mbs, bool) and plan.micro_batch_auto is None)


def describe(e: dict) -> str:
    w = e["workload"]
    return (f"{w.get('model')} ({w['arch']}, {count_text(w['parameters'])} parameters), world_size {w['world_size']}, "
            f"{w['tokens_per_microbatch']} tokens per micro-batch, {w['precision']} on {w['device']}")


# ------------------------------------------------------------------------------ distance and lookup
def device_cost(a: Optional[str], b: Optional[str]) -> Optional[float]:
    """0 for one device type, SIBLING_COST for two GPUs of one architecture (the presets' compute capability,
    bench/machine/hardware.py), None for devices never compared."""
    if str(a or "").lower() == str(b or "").lower():
        return 0.0
    pa, pb = match_hardware(a), match_hardware(b)
    if pa is None or pb is None or pa.compute_capability != pb.compute_capability:
        return None
    return SIBLING_COST


def distance(a: dict, b: dict) -> tuple[float, dict]:
    """(distance, its parts) of two workloads (module docstring); devices that are never compared: inf."""
    def log2(x: str) -> float:
        return abs(math.log2(max(a[x], 1) / max(b[x], 1)))

    dev = device_cost(a.get("device"), b.get("device"))
    if dev is None:
        return math.inf, {"device": math.inf}
    one = (a["world_size"] == 1) != (b["world_size"] == 1)
    parts = {"device": dev, "parameters": log2("parameters"), "tokens_per_microbatch": log2("tokens_per_microbatch"),
             "world_size": log2("world_size") + (ONE_RANK_COST if one else 0.0),
             "arch": ARCH_COST if a["arch"] != b["arch"] else 0.0,
             "precision": PRECISION_COST if a["precision"] != b["precision"] else 0.0}
    return round(sum(parts.values()), 3), {k: round(v, 3) for k, v in parts.items()}


def nearest(spec, strategy: dict, wl: dict, entries: Optional[list] = None) -> Optional[dict]:
    """The nearest entry of this strategy identity on this device or a sibling, near or not: {entry, origin,
    distance, parts}; None when there is none.  Ties: the user's own before the shipped, then the faster."""
    ident, found = identity(spec, strategy), None
    for origin, e in load() if entries is None else entries:
        if (e.get("strategy") or {}).get("name") != spec.name or identity(spec, e["strategy"]) != ident:
            continue
        d, parts = distance(wl, e["workload"])
        if math.isinf(d):
            continue
        rank = (d, origin != "user", -(e.get("tokens_per_s") or 0.0))
        if found is None or rank < found["rank"]:
            found = {"rank": rank, "entry": e, "origin": origin, "distance": d, "parts": parts}
    return found


def as_profile(e: dict, spec, d: float) -> dict:
    """An entry's settings as a profile (bench/run/tuning_profiles.py): a knob that needs another (compile_mode
    needs compile) is applied together with it."""
    settings = {k: v for k, v in (e.get("settings") or {}).items() if k != MICRO_BATCH}
    evidence = (f"measured {e.get('tokens_per_s') or 0:,.0f} tokens/s at {describe(e)}, distance {d:.2f} "
                f"({e.get('source') or 'this machine'})")
    groups: dict[str, list[str]] = {}
    for k in settings:
        section, _, leaf = k.rpartition(".")
        f = fields_of(spec.schema if section == "strategy" else BenchConfig).get(leaf)
        needs = [r for r in ((f.metadata.get("requires") if f else None) or {}) if r in settings and r != k]
        groups.setdefault(needs[0] if needs else k, [])
        groups[needs[0] if needs else k].append(k)
    out = {}
    for members in groups.values():
        keys = tuple(members) if len(members) > 1 else members[0]
        out[keys] = (tuple(settings[k] for k in members) if len(members) > 1 else settings[members[0]], evidence)
    return out


# ------------------------------------------------------------------------------ entries from searches
def entry(spec, base: dict, won: dict, tokens_per_s: float, fixed_micro_batch: bool, **extra) -> dict:
    """A store entry from the metrics.json of a search's base (its default trial) and of its winner (the
    settings: where the winner differs from the base; the schema's defaults where the base did not run)."""
    cfg, bcfg = won["config"], base["config"]
    keys = sorted(settings_keys(spec))
    if base is won:
        bcfg = {"strategy": {n: _default(f) for n, f in fields_of(spec.schema).items()},
                **{n: _default(f) for n, f in fields_of(BenchConfig).items() if n != "strategy"}, **{
                    k: v for k, v in cfg.items() if k in ("model", "world_size", "precision")}}
    settings = {k: setting(cfg, k) for k in keys if setting(cfg, k) != setting(bcfg, k)}
    lay = ((base.get("memory") or {}).get("plan") or {}).get("layout") or {}
    devices = [d for d in ((won.get("provenance") or {}).get("devices") or []) if d]
    mem = won.get("memory") or {}
    run = typed(BenchConfig, bcfg, {"model": ModelConfig, "strategy": spec.schema})  # the base's config, read typed
    wl = workload(run, devices[0] if devices else None, lay.get("dp") or 1,
                  lay.get("micro_batch_size") or run.model.global_batch, fixed_micro_batch)
    peak = mem.get("max_allocated_mb") if mem.get("max_allocated_mb") is not None else mem.get("host_peak_rss_mb")
    won_lay = ((mem.get("plan") or {}).get("layout")) or {}
    return {"strategy": stored_identity(spec, bcfg["strategy"]), "settings": settings,
            "micro_batch_size": won_lay.get("micro_batch_size"), "tokens_per_s": tokens_per_s,
            "peak_memory_mb": peak, "peak_memory_source": "max_allocated" if mem.get("max_allocated_mb") is not None
            else "host_rss", "workload": wl, "date": (won.get("provenance") or {}).get("date_utc"), **extra}


def _searches(tune: dict) -> Iterable[tuple[str, dict]]:
    """(sub-folder, search) of a tune.json: one search's, or a results folder's several, keyed by sub-folder."""
    if "bases" in tune:
        yield "", tune
        return
    for sub, t in tune.items():
        if isinstance(t, dict) and "bases" in t:
            yield sub, t


def winner(trials: list[dict]) -> tuple[Optional[dict], Optional[int]]:
    """The fastest trial at the deepest rung any trial was measured at (a trial measured only at an
    earlier rung, one short run, is not ranked against it: host jitter alone moves a short run by more
    than the differences a search separates; a survivor the budget left pending is the resumed search's
    to measure).  Fastest by timed-window tokens/s, median over its repeats: multirun_analysis picks a
    strategy's best by the same rule (answer._best), so that tune.json and the report name the same
    winner; the median step only decides promotion, where a short trial's slowest steps weigh most."""
    deepest = max((int(r) for t in trials for r in t.get("measured", {})), default=None)
    if deepest is None:
        return None, None
    measured = [t for t in trials if str(deepest) in t.get("measured", {})]
    return max(measured, key=lambda t: _finite(t["measured"][str(deepest)]["tokens_per_s"])), deepest


def _finite(x: Optional[float]) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else -1.0


def _winner(trials: list[dict], recorded: Optional[dict]) -> Optional[tuple[dict, str, float, Optional[int]]]:
    """(trial, its run's folder, tokens/s, rung) of a base's winner by the current rule (``winner``); a
    tune.json written before trials kept their measurements: its recorded winner."""
    top, at = winner(trials)
    if top is not None:
        m = top["measured"][str(at)]
        return top, m["dir"], m["tokens_per_s"], at
    if recorded:
        t = next((t for t in trials if t["name"] == recorded["name"]), None)
        return (t, recorded["dir"], recorded["tokens_per_s"], recorded.get("rung")) if t else None
    return None


def from_tune(tune: dict, find: Callable[[str, str, Optional[str]], Optional[dict]], source: str) -> list[dict]:
    """Entries of every base of a tune.json with a winner; ``find(sub, dir, run key)`` gives a run's metrics."""
    from bench.spec.commands import override_key, rerun_command
    from bench.strategies.registry import get_spec

    out = []
    for sub, search in _searches(tune):
        for b in search.get("bases") or []:
            w = _winner(b.get("trials") or [], b.get("winner"))
            default = next((t for t in b.get("trials") or [] if t["name"] == "default"), None)
            won = find(sub, w[1], w[0].get("key")) if w else None
            if won is None or won.get("status") != "completed" or not w[2]:
                continue
            base = find(sub, default["dir"], default.get("key")) if default and default.get("dir") else None
            base = base if base and base.get("status") == "completed" else won
            fixed = any(override_key(o) in (MICRO_BATCH, "strategy.microbatches", "microbatches") for o in b["base"])
            spec = get_spec(won["config"]["strategy"]["name"])
            command = rerun_command(b["base"] + [o for o in w[0]["overrides"] if o not in b["base"]])
            out.append(entry(spec, base, won, w[2], fixed, source=f"{source}{'#' + sub if sub else ''}",
                             command=command, measured={"rung": w[3], "dir": w[1]}))
    return out


def _key(e: dict) -> str:
    w = dict(e["workload"], device=str(e["workload"].get("device")).lower())
    w.pop("model", None)
    return json.dumps([e["strategy"], w], sort_keys=True, default=str)


def record(entries: list[dict], path: Optional[Path] = None) -> Path:
    """Add entries to a store (the user's by default), each replacing one of the same strategy and workload;
    under a lock, written atomically: two searches ending together both keep their winners."""
    path = Path(path) if path else user_store()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        new = {_key(e) for e in entries}
        kept = [e for e in read_entries(path) if _key(e) not in new]
        write_json_atomic(path, {"entries": kept + list(entries)})
    return path


# ------------------------------------------------------------------------------ python -m bench.plan.bests
def _runs_index(folder: Path) -> Callable[[str, str, Optional[str]], Optional[dict]]:
    """A results folder's runs: runs.json (the runs' metrics.json, each with its run_dir) or the run folders."""
    runs = json.loads((folder / "runs.json").read_text()) if (folder / "runs.json").is_file() else []

    def find(sub: str, d: str, key: Optional[str]) -> Optional[dict]:
        names = {f"{sub}/{d}".lstrip("/"), f"{sub.rsplit('/', 1)[-1]}/{d}".lstrip("/")}
        hits = [r for r in runs if r.get("run_dir") in names]
        if len(hits) > 1:  # two searches' sub-folders of one name (300m/tune, gpt2/tune): the run key decides
            hits = [r for r in hits if (r.get("job") or {}).get("key") == key]
        return hits[0] if hits else read_json_dict(folder / sub / d / "metrics.json")
    return find


def build(paths: list[Path]) -> list[dict]:
    """Entries from every tune.json under the paths."""
    out = []
    for root in paths:
        for tune_path in sorted(Path(root).rglob("tune.json")):
            tune = read_json_dict(tune_path) or {}
            out += from_tune(tune, _runs_index(tune_path.parent), str(tune_path))
    return sorted(out, key=lambda e: (e["workload"]["device"], str(e["workload"].get("model")), _key(e)))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.plan.bests", description="Rebuild the shipped store of measured "
                                 "bests (bench/plan/bests.json) from the searches' tune.json under the folders.")
    ap.add_argument("paths", nargs="*", default=["results"], type=Path)
    ap.add_argument("--out", type=Path, default=SHIPPED)
    args = ap.parse_args(argv)
    entries = build(args.paths)
    write_json_atomic(args.out, {"generated_by": "python -m bench.plan.bests " + " ".join(map(str, args.paths)),
                                 "entries": entries})
    sources = sorted({e["source"].split("#")[0] for e in entries})
    print(f"{args.out}: {len(entries)} entries from {len(sources)} tune.json: {', '.join(sources)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

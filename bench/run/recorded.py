"""Recorded runs as the calibration reads them (bench/calibrate.py): each completed run of a results folder,
re-planned under today's code, with the terms of its prediction and its measured median step.

Recorded configurations lack the keys added since they ran: they get their schema defaults (the added knobs
did not exist, so the default is what ran), except where the default changed since (LEGACY: runs before
``metrics.step_timing`` existed synchronised after every step).  An alias recorded unresolved
(``${bench_alias:microbatches,null}``) reads as its default.  A configuration that today's rules refuse is
counted as not re-plannable and left out.  A recorded ``tuning=best`` configuration holds the values its
profile applied, so it is re-planned as it ran (tuning=default).
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Optional

from bench.machine.hardware import HardwareConfig, recorded
from bench.plan.predict import gpu_type, host_key, plan_topology, terms
from bench.run.runs import with_added_defaults
from bench.spec.schema import BenchConfig, fields_of

LEGACY = {("metrics", "step_timing"): "sync"}  # keys whose default changed since runs were recorded
_ALIAS = re.compile(r"^\$\{bench_alias:\w+,(.*)\}$")


def _default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        d = f.default_factory()
        return dataclasses.asdict(d) if dataclasses.is_dataclass(d) else d
    return f.default


def _fill(values: dict, schema: type, path: tuple = ()) -> None:
    """Missing keys of a recorded section get their schema default (LEGACY's where it changed)."""
    for name, f in fields_of(schema).items():
        d = _default(f)
        if d is dataclasses.MISSING or (isinstance(d, str) and d.startswith("${")) or name == "hardware":
            continue
        if name not in values:
            values[name] = LEGACY.get((*path, name), d)
        elif isinstance(values[name], dict) and f.default_factory is not dataclasses.MISSING:
            sub = f.default_factory()
            if dataclasses.is_dataclass(sub):
                _fill(values[name], type(sub), (*path, name))
    for name, v in list(values.items()):
        hit = _ALIAS.match(v) if isinstance(v, str) else None
        if hit:
            raw = hit.group(1)
            values[name] = None if raw == "null" else int(raw) if raw.isdigit() else raw


def replan(record: dict):
    """The Plan of a recorded run under today's code (raises ConfigError / KeyError when it cannot be)."""
    from bench.run.config import validate
    from bench.strategies.registry import get_spec

    cfg = with_added_defaults({k: v for k, v in record["config"].items() if k != "_command"})
    cfg = json.loads(json.dumps(cfg))  # a deep copy: the record stays as read
    cfg.pop("hardware", None)
    _fill(cfg, BenchConfig)
    _fill(cfg["strategy"], get_spec(cfg["strategy"]["name"]).schema, ("strategy",))
    cfg["device"], cfg["tuning"] = "cuda", "default"  # the record is what ran, a tuning profile already applied
    return validate(cfg, gpus=cfg["world_size"])


def device_name(record: dict) -> Optional[str]:
    """The GPU a recorded run ran on, as nvidia-smi names it (provenance, else rank 0's record)."""
    devices = (record.get("provenance") or {}).get("devices") or []
    if devices:
        return devices[0].get("name") if isinstance(devices[0], dict) else devices[0]
    ranks = record.get("ranks") or [{}]
    failed = [f.get("device_name") for f in record.get("failures") or [] if f.get("device_name")]
    return ranks[0].get("device_name") or (failed[0] if failed else None)


def result_folders(dirs: list[Path]) -> list[Path]:
    """The results folders (those holding a runs.json) named by ``dirs``: each a folder or a directory of them."""
    return sorted(p for d in dirs for p in ([d] if (d / "runs.json").exists() else d.glob("*/"))
                  if (p / "runs.json").exists())


def load_runs(folders: list[Path]) -> tuple[list[dict], dict]:
    """Every completed, re-plannable run on a known GPU in ``folders``: its folder, plan, device, terms, the
    measured median step and tokens per step; and the counts of what was left out and why."""
    runs, left = [], {"not_completed": 0, "not_replannable": 0, "unknown_device": 0, "why_not_replannable": {}}
    for path in folders:
        for rec in json.loads((path / "runs.json").read_text()):
            if rec.get("status") != "completed" or not rec.get("config"):
                left["not_completed"] += 1
                continue
            try:
                plan = replan(rec)
            except Exception as e:  # noqa: BLE001 - any refusal of today's rules: not re-plannable
                left["not_replannable"] += 1
                why = left["why_not_replannable"]
                why[str(e)[:120]] = why.get(str(e)[:120], 0) + 1
                continue
            hw = recorded((rec.get("config") or {}).get("hardware"), device_name(rec))  # its profile, else its GPU's
            if hw is None:
                left["unknown_device"] += 1
                continue
            m, prov = plan.model, rec.get("provenance") or {}
            nodes = len((rec.get("placement") or {}).get("nodes") or {}) or plan_topology(plan, hw).nodes
            runs.append({"folder": path.name, "plan": plan, "device": hw.gpu, "hardware": hw, "terms": terms(plan, hw),
                         "case": (gpu_type(hw), str(nodes), plan.strategy.name),
                         "host": host_key(prov.get("hostname"), prov.get("cpu_count")),
                         "regime": plan.run.link_regime or "default",
                         "step": float(rec["step_time_s"]["median"]), "tokens": m.global_batch * m.seq_len})
    return runs, left


def probe_of(hw: HardwareConfig) -> Optional[tuple]:
    """The probe profile a run was planned with, (host, date, link figure GB/s): None for a preset."""
    probe = (hw.probe or {}) if hw.source == "probe" else {}
    return (probe.get("host"), probe.get("date"), hw.intra_node_gbps) if probe else None

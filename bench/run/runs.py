"""Run identity and run folders: the run key, the statuses, and reading what a folder holds.

One module below the single run (bench/launch/job.py), the sweeper (bench/sweep/, bench/launch/slurm/) and
the analysis (multirun_analysis), so that all three agree on what a run is:

* :func:`run_key`: a hash of the resolved configuration, without the keys that do not change
  what a run measures (``volatile`` in the schema) and without knobs added since runs were first
  recorded while they are at their default (``added``): an older sweep folder still resumes.
  Both sets are read from the schema (bench/spec/schema.py ``knob``), never from a hand-kept list;
* :func:`with_added_defaults`: the reading side of that rule, for runs recorded before a knob;
* the statuses, ``status.json`` (written at each change) and :func:`read_result`.

A run's overrides as a command: bench/spec/commands.py.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Optional

from bench.jsonio import read_json_dict, write_json_atomic
from bench.metrics import STATUSES, skeleton
from bench.spec.schema import BenchConfig, ModelConfig, fields_of

FAILED = ("failed", "oom", "timeout", "interrupted")  # final, not completed, worth a re-run
ATTEMPTS = ".attempts"


# ------------------------------------------------------------------------------ keys
def volatile_keys() -> tuple[str, ...]:
    """Top-level keys that do not change what a run measures (and the recorded command)."""
    return tuple(n for n, f in fields_of(BenchConfig).items() if f.metadata.get("volatile")) + ("_command",)


def _default(f) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def _added(schema: type) -> dict[str, Any]:
    return {n: _default(f) for n, f in fields_of(schema).items() if f.metadata.get("added")}


def _strategy_schema(cfg: dict) -> Optional[type]:
    from bench.strategies.registry import specs

    s = cfg.get("strategy")
    spec = specs().get(s.get("name")) if isinstance(s, dict) else None
    return spec.schema if spec else None


def _sections(cfg: dict) -> list[tuple[Optional[str], type]]:
    """(section, schema) pairs whose ``added`` knobs a config has: top level, model, strategy."""
    out = [(None, BenchConfig), ("model", ModelConfig)]
    schema = _strategy_schema(cfg)
    return out + [("strategy", schema)] if schema else out


def run_key(cfg: dict) -> str:
    """Hash of a resolved run configuration (plain containers), by the rule of the module docstring."""
    vol = volatile_keys()
    c = {k: v for k, v in cfg.items() if k not in vol}
    for section, schema in _sections(cfg):
        parent = c.get(section) if section else c
        if not isinstance(parent, dict):
            continue
        rest = {k: v for k, v in parent.items() if not (k in _added(schema) and v == _added(schema)[k])}
        if section:
            c[section] = rest  # a copy: cfg stays as it was
        else:
            c = rest
    blob = json.dumps(c, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def with_added_defaults(cfg: dict) -> dict:
    """A recorded run's configuration with the knobs added since, at the defaults that do what it did,
    so that an older and a newer run of one configuration are one experiment (multirun_analysis)."""
    out = dict(cfg)
    for section, schema in _sections(cfg):
        if section and not isinstance(out.get(section), dict):
            continue
        target = dict(out[section]) if section else out
        for k, v in _added(schema).items():
            target.setdefault(k, v)
        if section:
            out[section] = target
    return out


# ------------------------------------------------------------------------------ run folders
@dataclass
class Result:
    dir: Path
    status: Optional[str]  # a final status, pending, running, or None (unknown)
    key: Optional[str]
    info: dict = field(default_factory=dict)  # status.json


def write_status(run_dir: Path, status: str, **extra) -> None:
    write_json_atomic(run_dir / "status.json", {"status": status, "time": time.time(), **extra})


def read_result(d: Path) -> Optional[Result]:
    """What a run folder holds (None: no status.json and no metrics.json)."""
    st, m = read_json_dict(d / "status.json"), read_json_dict(d / "metrics.json")
    if st is None and m is None:
        return None
    status = (st or {}).get("status")
    if status not in STATUSES and m and m.get("status") in STATUSES:
        status = m["status"]  # status.json not updated (killed between the two writes)
    key = (st or {}).get("key") or ((m or {}).get("job") or {}).get("key")
    if key is None and m and isinstance(m.get("config"), dict):
        key = run_key(m["config"])  # results written before run keys existed
    return Result(d, status, key, st or {})


def holds_completed(d: Path) -> bool:
    r = read_result(d) if d.is_dir() else None
    return r is not None and r.status == "completed"


def scan(sweep_dir: Path) -> list[Result]:
    """Every run folder directly under a sweep folder."""
    out = []
    if sweep_dir.is_dir():
        for d in sorted(sweep_dir.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                r = read_result(d)
                if r is not None:
                    out.append(r)
    return out


def move_aside(d: Path) -> Optional[Path]:
    """Move what a folder holds (a failed or stale attempt) into <d>/.attempts/<n>/."""
    items = [p for p in d.iterdir() if p.name != ATTEMPTS] if d.is_dir() else []
    if not items:
        return None
    n = 1
    while (d / ATTEMPTS / str(n)).exists():
        n += 1
    dest = d / ATTEMPTS / str(n)
    dest.mkdir(parents=True)
    for p in items:
        shutil.move(str(p), str(dest / p.name))
    return dest


def read_failures(run_dir: Path) -> list[dict]:
    """The ranks' own failure records, earliest first (the first is the root cause)."""
    found = (read_json_dict(p) for p in run_dir.glob("failure_rank*.json"))
    return sorted((f for f in found if f is not None), key=lambda f: f.get("time", 0))


def mark_unfinished(d: Path, cfg: Optional[dict], status: str, err_type: str, message: str,
                    failures: Optional[list] = None) -> None:
    """Give a run that ended without recording a final status one (with the reason)."""
    r = read_result(d)
    if r is not None and r.status in STATUSES:
        return
    err = {"rank": None, "type": err_type, "message": message, "traceback": None}
    if failures:  # the ranks' own records: the earliest is the root cause
        root = failures[0]
        err = {k: root.get(k) for k in ("rank", "type", "message", "traceback")}
        status = "oom" if root.get("oom") else status
    info = (r.info if r else {}) or {}
    m = skeleton(cfg or {}, status, err)
    m["failures"] = failures or []
    m["job"] = {"key": info.get("key")}
    write_json_atomic(d / "metrics.json", m)
    write_json_atomic(d / "status.json", {**info, "status": status, "reason": message, "time": time.time()})

"""Find bench run folders and read each into one flat row (one run = one row).

Real sweeps leave debris behind: runs still going or killed (no ``metrics.json``; a
``status.json`` saying "running", or nothing at all), half-written or corrupt JSON, files
from an older schema, runs without a config.  Nothing here raises on such a folder: every
folder becomes a row, its ``status`` says what happened ("incomplete" when there are no
usable metrics), ``usable`` says whether it can enter the aggregates, ``reason`` says why
not, and ``problems`` lists every data-quality issue, so that nothing is dropped silently.

The config is flattened generically: ``model.name`` -> ``model``, ``strategy.name`` ->
``strategy``, every other ``model.*``/``strategy.*`` key loses its section prefix when that
name is unambiguous (``strategy.zero_stage`` -> ``zero_stage``), the rest stays dotted
(``optim.lr``).  New strategy knobs therefore appear as columns without code changes.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from bench.run.runs import STATUSES, with_added_defaults
from bench.spec.schema import BenchConfig, fields_of

SHORTHANDS = {n for n, f in fields_of(BenchConfig).items() if f.metadata.get("alias")}
from multirun_analysis import breakdown, trust

SCHEMA_VERSION = 1  # the metrics.json schema this module was written against
RUN_MARKERS = (".hydra/config.yaml", "metrics.json", "status.json")
# metrics.json sections whose scalars become "<section>.<key>" columns
METRIC_SECTIONS = ("throughput", "step_time_s", "loss", "skipped_steps", "flops", "memory",
                   "utilization", "energy", "layout", "job")
NOT_SCALAR = {"step_time_s.all", "loss.per_step"}  # long lists: in metrics.json, not in the table
META_COLUMNS = ("run_dir", "status", "usable", "reason", "error_type", "error_message", "status_json",
                "schema_version", "overrides", "device_type", "timed_steps", "n_ranks", "tokens",
                "time_s", "tokens_per_s", "time_per_token_s", "mem_mean_mb", "mem_peak_mb",
                "mem_total_mb", "mem_source", "not_to_trust", "problems")
NON_CONFIG_PREFIXES = tuple(s + "." for s in METRIC_SECTIONS) + ("prov.", "rank0.", "profile.", "trust.")
RANK0_TIMES = ("setup_s", "startup_phases_s", "setup_phases_s")  # rank 0's start-up, as rank0.* columns
FRONT = ("model", "strategy", "impl", "world_size", "precision", "compile", "global_batch", "seq_len")


# ------------------------------------------------------------------------------ discovery
def is_run_dir(d: Path) -> bool:
    return any((d / m).is_file() for m in RUN_MARKERS)


def find_runs(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[str]]:
    """Every run folder under the given paths (at any depth); returns (runs, problems)."""
    runs, problems, seen = [], [], set()
    for p in map(Path, paths):
        if not p.exists():
            problems.append(f"{p}: path does not exist")
            continue
        for root, dirs, _ in os.walk(p):
            dirs[:] = sorted((d for d in dirs if not d.startswith(".")), key=_natural)
            d = Path(root)  # as given (relative paths stay relative in the tables and report)
            if is_run_dir(d) and d.resolve() not in seen:
                seen.add(d.resolve())
                runs.append(d)
    return runs, problems


def _natural(name: str):
    """Sort 2 before 10 (Hydra numbers jobs 0, 1, ... 10)."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


# ------------------------------------------------------------------------------ one run
def _oneline(e: Exception, n: int = 100) -> str:
    """An error as one short line (problems are listed one per line, joined with '; ')."""
    return " ".join(str(e).split()).replace("; ", ", ")[:n]


def _read_json(path: Path, problems: list[str]) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except Exception as e:  # truncated, empty, binary, unreadable: a problem, never fatal
        problems.append(f"{path.name} unreadable ({type(e).__name__}: {_oneline(e)})")
        return None


def _read_hydra_config(d: Path, problems: list[str]) -> dict | None:
    path = d / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    try:
        from omegaconf import OmegaConf
        c = OmegaConf.load(path)
        try:
            out = OmegaConf.to_container(c, resolve=True)
        except Exception:  # an interpolation that needs Hydra's runtime: keep it as written
            out = OmegaConf.to_container(c, resolve=False)
        return out if isinstance(out, dict) else None
    except Exception as e:
        problems.append(f".hydra/config.yaml unreadable ({type(e).__name__}: {_oneline(e)})")
        return None


def _read_overrides(d: Path) -> str | None:
    try:
        import yaml
        o = yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())
        return " ".join(map(str, o)) if isinstance(o, list) else None
    except Exception:
        return None


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested dict -> {"a.b": scalar}; lists become JSON text (one cell, hashable)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(v, default=str)
        else:
            out[key] = v
    return out


def _num(x) -> float:
    """A finite float or NaN (None, strings, bools and inf are not measurements)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return math.nan
    return float(x) if math.isfinite(x) else math.nan


def _rank_memory(m: dict) -> dict:
    """Mean/peak/total over ranks of each rank's peak memory (CUDA allocator; host RSS on CPU)."""
    ranks = [r for r in (m.get("ranks") or []) if isinstance(r, dict)]
    mem = m.get("memory") if isinstance(m.get("memory"), dict) else {}
    for key, source in (("max_allocated_mb", "cuda max_allocated"), ("host_peak_rss_mb", "host peak RSS")):
        xs = [_num(r.get(key)) for r in ranks]
        xs = [x for x in xs if not math.isnan(x)]
        if xs:
            return {"n_ranks": len(ranks), "mem_mean_mb": sum(xs) / len(xs), "mem_peak_mb": max(xs),
                    "mem_total_mb": sum(xs), "mem_source": source}
        if not ranks and not math.isnan(_num(mem.get(key))):  # no per-rank records: the run's peak only
            return {"n_ranks": math.nan, "mem_mean_mb": math.nan, "mem_peak_mb": _num(mem[key]),
                    "mem_total_mb": math.nan, "mem_source": source}
    return {"n_ranks": len(ranks) if ranks else math.nan, "mem_mean_mb": math.nan, "mem_peak_mb": math.nan,
            "mem_total_mb": math.nan, "mem_source": None}


def read_run(d: str | os.PathLike) -> tuple[dict, dict]:
    """One run folder -> (meta/metric row, flattened config).  Never raises on bad content."""
    d = Path(d)
    problems: list[str] = []
    row: dict[str, Any] = {**dict.fromkeys(META_COLUMNS), "run_dir": str(d), "overrides": _read_overrides(d)}
    st = _read_json(d / "status.json", problems)
    row["status_json"] = st.get("status") if isinstance(st, dict) else None
    m = _read_json(d / "metrics.json", problems)
    not_object = m is not None and not isinstance(m, dict)
    if not_object:
        problems.append("metrics.json is not a JSON object")
        m = None
    cfg = _run_config(d, m, st, row, problems)
    # the shorthands (zero_stage=, microbatches=) were copied into strategy.*: their columns say it
    flat_cfg = flatten({k: v for k, v in (cfg or {}).items() if k != "_command" and k not in SHORTHANDS})
    if m is None:
        _no_metrics(d, not_object, row, problems)
        m = {}
    else:
        _status_from_metrics(m, st, row, problems)
    _error_columns(m, row, problems)
    _metric_columns(m, row)
    _measures(m, row, problems)
    _usability(row, problems)
    flags, lines = trust.run_flags(m, bool(row["usable"]))  # what not to trust (multirun_analysis/trust.py)
    row.update(flags)
    problems += lines
    row["problems"] = "; ".join(problems) or None
    return row, flat_cfg


def _run_config(d: Path, m: dict | None, st: Any, row: dict, problems: list[str]) -> dict | None:
    """What the run ran: metrics.json's config, else .hydra/config.yaml, else metrics.json's 'run'
    identity, else a pending run's status.json (which may also give the row its overrides)."""
    cfg = m.get("config") if m is not None and isinstance(m.get("config"), dict) else None
    if cfg is None:
        cfg = _read_hydra_config(d, problems)
    if cfg is not None:  # knobs added to bench since the run was recorded, at the defaults it ran with
        cfg = with_added_defaults(cfg)
    if cfg is None and m is not None and isinstance(m.get("run"), dict):
        r = m["run"]  # older/partial metrics: the run identity still says what ran
        cfg = {"model": {"name": r.get("model"), "global_batch": r.get("global_batch"),
                         "seq_len": r.get("seq_len")},
               "strategy": {"name": r.get("strategy"), "impl": r.get("impl")},
               **{k: r.get(k) for k in ("world_size", "precision", "compile", "steps", "warmup_steps", "seed")}}
        problems.append("no config in metrics.json or .hydra/config.yaml: identity taken from metrics.json 'run'")
    if cfg is None and isinstance(st, dict) and st.get("model"):
        # a sweep's pending (never started) run: its status.json says what it would have run
        cfg = {"model": {"name": st["model"]}, "strategy": {"name": st.get("strategy")},
               **{k: st.get(k) for k in ("world_size", "precision", "steps")}}
        if row["overrides"] is None and isinstance(st.get("overrides"), list):
            row["overrides"] = " ".join(map(str, st["overrides"]))
    if cfg is None:
        problems.append("no config (.hydra/config.yaml and metrics.json config both missing)")
    return cfg


def _no_metrics(d: Path, not_object: bool, row: dict, problems: list[str]) -> None:
    """status "incomplete" and why, for a run without usable metrics.json."""
    row["status"] = "incomplete"
    if not_object:  # valid JSON (a list, a number, null): not what bench writes
        row["reason"] = "metrics.json is not a JSON object"
    elif (d / "metrics.json").is_file():
        row["reason"] = "metrics.json unreadable (corrupt or partially written)"
    elif row["status_json"]:
        row["reason"] = f"no metrics.json; status.json says {row['status_json']!r} (in progress or killed)"
    else:
        row["reason"] = "no metrics.json and no status.json (killed before it started?)"
    if not (d / "metrics.json").is_file():  # (an unreadable file is already a problem)
        problems.append(row["reason"])


def _status_from_metrics(m: dict, st: Any, row: dict, problems: list[str]) -> None:
    """schema_version and status of a metrics.json, checked against this module and status.json."""
    ver = m.get("schema_version")
    row["schema_version"] = ver
    if ver != SCHEMA_VERSION:
        problems.append(f"schema_version {ver!r} (this analysis reads {SCHEMA_VERSION}): loaded what is present")
    status = m.get("status")
    if isinstance(status, dict):  # a status record in place of the word: said as a line, its word kept
        problems.append("metrics.json's status is a record, not a word: " + readable(status))
        status = status.get("status")
    if status not in STATUSES:
        problems.append(f"unknown status {status!r} in metrics.json")
        status = "incomplete" if status is None else str(status)
    row["status"] = status
    if st is not None and row["status_json"] not in (status, None):
        problems.append(f"status.json says {row['status_json']!r}, metrics.json says {status!r}")


def readable(record: dict) -> str:
    """A record as one line: its status first, then its scalar fields (``pending: model=tiny, world_size=2``)."""
    rest = ", ".join(f"{k}={' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in record.items()
                     if k != "status" and not isinstance(v, dict))
    return f"{record.get('status', '?')}" + (f": {rest}" if rest else "")


def _error_columns(m: dict, row: dict, problems: list[str]) -> None:
    if m.get("exit_warning"):  # completed, then a rank crashed or hung on its way out: kept, but said
        problems.append(f"exit_warning: {m['exit_warning']}")
    err = m.get("error") if isinstance(m.get("error"), dict) else {}
    row["error_type"] = err.get("type")
    row["error_message"] = err.get("message")


def _metric_columns(m: dict, row: dict) -> None:
    """Every scalar of metrics.json as "<section>.<key>", prov.*, rank0.* and profile.* columns."""
    for sec in METRIC_SECTIONS:
        if isinstance(m.get(sec), dict):
            row.update({f"{sec}.{k}": v for k, v in flatten(m[sec]).items() if f"{sec}.{k}" not in NOT_SCALAR})
    run = m.get("run") if isinstance(m.get("run"), dict) else {}
    row["device_type"], row["timed_steps"] = run.get("device_type"), run.get("timed_steps")
    prov = m.get("provenance") if isinstance(m.get("provenance"), dict) else {}
    if isinstance(prov.get("command"), list):
        prov = {**prov, "command": " ".join(map(str, prov["command"]))}
    if isinstance(prov.get("devices"), list):
        prov = {**prov, "devices": "; ".join(sorted({str(x) for x in prov["devices"] if x})) or None}
    row.update({f"prov.{k}": v for k, v in flatten(prov).items()})
    ranks = m.get("ranks") if isinstance(m.get("ranks"), list) else []
    r0 = ranks[0] if ranks and isinstance(ranks[0], dict) else {}
    row.update({f"rank0.{k}": v for k, v in flatten({k: r0[k] for k in RANK0_TIMES if k in r0}).items()})
    row.update(breakdown.run_columns(m))  # profiled runs: profile.<part>_ms, mean over ranks


def _measures(m: dict, row: dict, problems: list[str]) -> None:
    """The measures the summary aggregates (definitions: summarize.py)."""
    thr = m.get("throughput") if isinstance(m.get("throughput"), dict) else {}
    row["tokens"] = _num(thr.get("tokens_timed"))
    row["time_s"] = _num(thr.get("timed_window_s"))
    if math.isnan(row["time_s"]):
        windows = [_num(r.get("window_s")) for r in (m.get("ranks") or []) if isinstance(r, dict)]
        windows = [w for w in windows if not math.isnan(w)]
        if windows and row["status"] == "completed":
            row["time_s"] = max(windows)
            problems.append("throughput.timed_window_s missing: time = max of ranks' window_s")
    ok = row["tokens"] > 0 and row["time_s"] > 0
    row["tokens_per_s"] = row["tokens"] / row["time_s"] if ok else math.nan
    row["time_per_token_s"] = row["time_s"] / row["tokens"] if ok else math.nan
    rec = _num(thr.get("tokens_per_s"))
    if ok and not math.isnan(rec) and abs(rec - row["tokens_per_s"]) > 1e-6 * rec:
        problems.append(f"recorded tokens_per_s {rec:.6g} != tokens_timed/timed_window_s {row['tokens_per_s']:.6g}")
    row.update(_rank_memory(m))


def _usability(row: dict, problems: list[str]) -> None:
    """usable: completed with tokens and a time window; else the reason it is not."""
    ok = row["tokens"] > 0 and row["time_s"] > 0
    row["usable"] = row["status"] == "completed" and ok
    if row["status"] == "completed" and not ok:
        row["reason"] = "completed, but metrics.json lacks tokens_timed/timed_window_s (partial or old schema)"
        problems.append(row["reason"])
    elif row["status"] != "completed" and not row.get("reason"):
        msg = (row["error_message"] or "").strip()
        row["reason"] = f"{row['status']}: {msg.splitlines()[0] if msg else 'no error message recorded'}"


# ------------------------------------------------------------------------------ all runs
def _config_names(flat_names: list[str], toplevel: set[str]) -> dict[str, str]:
    """Map dotted config keys to column names (see module docstring)."""
    names = {"model.name": "model", "strategy.name": "strategy"}
    short: dict[str, list[str]] = {}
    for n in flat_names:
        sec, _, rest = n.partition(".")
        if sec in ("model", "strategy") and rest and n not in names:
            short.setdefault(rest, []).append(n)
    taken = set(toplevel) | set(META_COLUMNS) | {"model", "strategy"}
    for s, full in short.items():
        if len(full) == 1 and s not in taken:
            names[full[0]] = s
    for n in flat_names:
        c = names.get(n, n)
        if c in META_COLUMNS or c.startswith(NON_CONFIG_PREFIXES):
            c = "cfg." + n
        names[n] = c
    return names


def load_runs(*paths: str | os.PathLike, warn: bool = True) -> pd.DataFrame:
    """All runs under ``paths`` (multirun, single-run or parent folders) as a DataFrame.

    One row per run folder; ``df.attrs["config_columns"]`` names the config columns and
    ``df.attrs["problems"]`` lists (run_dir, problem) pairs, also kept per row in ``problems``.
    """
    if len(paths) == 1 and isinstance(paths[0], (list, tuple)):
        paths = tuple(paths[0])
    dirs, problems = find_runs(paths)
    rows, cfgs = zip(*(read_run(d) for d in dirs)) if dirs else ((), ())
    flat_names = list(dict.fromkeys(k for c in cfgs for k in c))
    toplevel = {k for k in flat_names if "." not in k}
    names = _config_names(flat_names, toplevel)
    records = [{**r, **{names[k]: v for k, v in c.items()}} for r, c in zip(rows, cfgs)]
    df = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=list(META_COLUMNS))
    cfg_cols = list(dict.fromkeys(names[k] for k in flat_names))
    front = [c for c in FRONT if c in cfg_cols]
    cfg_cols = front + [c for c in cfg_cols if c not in front]
    metric_cols = [c for c in df.columns if c not in cfg_cols and c not in META_COLUMNS]
    meta = [c for c in META_COLUMNS if c in df.columns]
    first = [c for c in ("run_dir", "status", "usable", "reason", "error_type", "error_message") if c in meta]
    df = df[first + cfg_cols + [c for c in meta if c not in first] + metric_cols]
    df.attrs["config_columns"] = cfg_cols
    for sec in ("model", "strategy"):  # which columns came from which config section
        df.attrs[f"{sec}_columns"] = [names[k] for k in flat_names if k.split(".")[0] == sec]
    allp = [("", p) for p in problems] + [(r["run_dir"], p) for r in rows
                                          for p in (r["problems"] or "").split("; ") if p]
    df.attrs["problems"] = allp
    if warn and allp:
        warnings.warn(f"{len(allp)} problem(s) while loading runs, e.g. {allp[0][0]}: {allp[0][1]} "
                      "(see df.attrs['problems'] / the 'problems' column)", stacklevel=2)
    return df


def config_columns(df: pd.DataFrame) -> list[str]:
    """The config columns of a runs table (from attrs, else by elimination)."""
    if df.attrs.get("config_columns"):
        return [c for c in df.attrs["config_columns"] if c in df.columns]
    return [c for c in df.columns if c not in META_COLUMNS and not c.startswith(NON_CONFIG_PREFIXES)]


def problems_of(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(run_dir, problem) pairs of a runs table."""
    if "problems" in df.attrs:
        return list(df.attrs["problems"])
    return [(r, p) for r, ps in zip(df["run_dir"], df["problems"]) if isinstance(ps, str)
            for p in ps.split("; ")]

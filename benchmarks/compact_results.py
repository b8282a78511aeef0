"""Compact a results/<folder> to its README, its tables and one runs.json.

The raw run folders of a GPU session (Hydra outputs with .hydra/*.yaml, rank logs, per-run
metrics.json / status.json, plots, parquet, collected *_runs.json) make results/ too large to keep
in the tree, and they live in git history anyway. A compact folder keeps its README.md, its small
text tables and reports (*.md, *.txt < 30 KB, *.csv < 100 KB) and ONE runs.json: a minified list
of every metrics.json found anywhere under the folder (run folders, .attempts/, callN_*/, and the
entries of *_runs.json files, which benchmarks/collect.py wrote as lists of metrics dicts),
de-duplicated, each with an added "source" (its path relative to the folder, or
"<file>_runs.json[i]"; a duplicate's other paths go to "also_in"). config._command is left out
where provenance.command holds the same command line. A run folder with a status.json but no
metrics.json (a run that never wrote its metrics) becomes {"source": ..., "status": {...}}. Above
--max-bytes, per-sample / per-kernel series (BULKY_KEYS) are dropped from that folder's runs.json.

Every file that is dropped must be tracked at --commit (default: HEAD), so it stays reachable with
`git show <commit>:results/<folder>/<path>`; a file that is not is kept and reported. The README
gets one line saying so. Re-running on a compact folder changes nothing.

    python benchmarks/compact_results.py results/<folder> [...] [--commit HASH] [--dry-run]

benchmarks/unpack_runs.py turns a runs.json back into run folders for multirun_analysis.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

RUNS_JSON = "runs.json"
TEXT_LIMIT = 30_000  # *.txt / *.jsonl kept below this size
CSV_LIMIT = 100_000  # *.csv kept below this size
RAW_DIRS = {"runs", "multirun", "outputs", "logs"}  # sweep / run folders and log captures
DROP_NAMES = {"errors.txt"}  # tracebacks of failed launches (error dumps)
NOTE_MARK = "were removed from the tree on"
# Keys holding per-sample / per-kernel series, dropped (only) when a runs.json exceeds --max-bytes.
BULKY_KEYS = {"samples", "nvml_samples", "trace", "trace_events", "events", "top_kernels_ms_per_step",
              "top_cpu_ops_ms_per_step", "kernels", "preloaded_modules", "graph_break_reasons",
              "nvidia_smi_topo"}
META_KEYS = ("source", "also_in", "run_dir")


def _natural(p: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p)]


def _key(m: dict) -> str:
    return json.dumps({k: v for k, v in m.items() if k not in META_KEYS}, sort_keys=True)


def _strip(m: dict) -> dict:
    """Lossless: drop config._command where provenance.command holds the same command line."""
    cfg, prov = m.get("config"), m.get("provenance")
    if isinstance(cfg, dict) and isinstance(prov, dict) and "_command" in cfg \
            and cfg["_command"] == prov.get("command"):
        m = {**m, "config": {k: v for k, v in cfg.items() if k != "_command"}}
    return m


def _dump(entries: list) -> str:
    return json.dumps(entries, separators=(",", ":"), ensure_ascii=False)


def _files(folder: Path) -> list[str]:
    """Every file under folder (hidden ones included), relative, in natural order."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort(key=_natural)
        rel = Path(root).relative_to(folder)
        out += [(rel / f).as_posix() for f in files]
    return sorted(out, key=_natural)


def collect(folder: Path) -> tuple[list, bool]:
    """runs.json's entries: the existing ones, then every metrics / status not yet in them."""
    path = folder / RUNS_JSON
    old = json.loads(path.read_text()) if path.exists() else []
    entries = [_strip(e) for e in old]
    changed = entries != old
    by_key = {_key(e): e for e in entries}
    seen = {s for e in entries for s in [e.get("source"), *e.get("also_in", [])]}

    def add(m: dict, source: str) -> None:
        nonlocal changed
        if source in seen:
            return
        seen.add(source)
        changed = True
        m = _strip(m)
        k = _key(m)
        if k in by_key:  # the same run collected twice (run folder and a *_runs.json)
            e = by_key[k]
            e.setdefault("also_in", []).append(source)
            if "run_dir" in m and "run_dir" not in e:
                e["run_dir"] = m["run_dir"]
            return
        e = {**m, "source": source}
        by_key[k] = e
        entries.append(e)

    files = _files(folder)
    fileset = set(files)
    for f in files:  # run folders first, so a run's source is its own metrics.json
        if Path(f).name == "metrics.json":
            add(json.loads((folder / f).read_text()), f)
    for f in files:
        if f.endswith("_runs.json") and Path(f).name != RUNS_JSON:
            for i, m in enumerate(json.loads((folder / f).read_text())):
                add(m, f"{f}[{i}]")
    for f in files:
        if Path(f).name == "status.json" and (Path(f).parent / "metrics.json").as_posix() not in fileset:
            if f not in seen:
                seen.add(f)
                changed = True
                entries.append({"source": f, "status": json.loads((folder / f).read_text())})
    return entries, changed


def slim(o, dropped: set):
    """Drop BULKY_KEYS at any depth (keeps config, layout, status, loss, step times, throughput, ...)."""
    if isinstance(o, dict):
        for k in [k for k in o if k in BULKY_KEYS]:
            dropped.add(k)
            del o[k]
        for v in o.values():
            slim(v, dropped)
    elif isinstance(o, list):
        for v in o:
            slim(v, dropped)
    return o


def keep(rel: str, size: int) -> bool:
    p = Path(rel)
    if any(part in RAW_DIRS or part.startswith(".") for part in p.parts[:-1]):
        return False
    name, suf = p.name, p.suffix.lower()
    if name in (RUNS_JSON, "README.md") or suf == ".md" or (p.parent.name == "hardware" and suf == ".yaml"):
        return True  # hardware/*.yaml: the probe's profiles the runs were planned with
    if name in DROP_NAMES or name.endswith("_errors.txt") or size == 0:
        return False
    if suf == ".csv":
        return size < CSV_LIMIT
    if suf in (".txt", ".jsonl", ".tsv"):
        return size < TEXT_LIMIT
    return False  # *.log, *.png, *.parquet, *.yaml, metrics/status/summary/sweep/*_runs.json, ...


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def note_line(commit: str, folder_in_repo: str, date: str, has_runs: bool) -> str:
    line = (f"Raw run folders (Hydra outputs, logs, plots) {NOTE_MARK} {date}; they are in git history at "
            f"commit {commit} (`git show {commit}:{folder_in_repo}/...`).")
    return line + (" Every run's metrics are in `runs.json` here." if has_runs else "")


def add_note(readme: Path, line: str) -> bool:
    text = readme.read_text()
    if NOTE_MARK in text:
        return False
    lines = text.split("\n")
    i = 1 if lines and lines[0].startswith("#") else 0  # after the title
    while i < len(lines) and lines[i].strip() == "":
        i += 1
    lines[i:i] = [line, ""]
    if i == 1:
        lines.insert(1, "")
    readme.write_text("\n".join(lines))
    return True


def compact(folder: Path, commit: str, repo: Path, date: str, max_bytes: int, dry: bool) -> dict:
    rep = {"folder": folder.name}
    entries, changed = collect(folder)
    text = _dump(entries)
    if len(text.encode()) > max_bytes:
        dropped: set = set()
        entries = [slim(e, dropped) for e in entries]
        text = _dump(entries)
        changed = changed or bool(dropped)
        rep["slimmed"] = sorted(dropped)
    rep["runs"] = len(entries)
    rep["runs_json_bytes"] = len(text.encode())
    if entries and changed and not dry:
        (folder / RUNS_JSON).write_text(text)
        assert len(json.loads((folder / RUNS_JSON).read_text())) == len(entries)
    sources = {s for e in entries for s in [e.get("source"), *e.get("also_in", [])]}
    in_repo = folder.resolve().relative_to(repo).as_posix()
    tracked = set(_git(repo, "ls-tree", "-r", "--name-only", commit, "--", in_repo + "/").splitlines())
    drop, kept_untracked, kept_uncollected = [], [], []
    for f in _files(folder):
        if keep(f, (folder / f).stat().st_size):
            continue
        name = Path(f).name
        if name == "metrics.json" and f not in sources or \
                name.endswith("_runs.json") and not any(s.startswith(f + "[") for s in sources):
            kept_uncollected.append(f)  # never drop a result that is not in runs.json
        elif f"{in_repo}/{f}" not in tracked:
            kept_untracked.append(f)  # not in git history at --commit: keep
        else:
            drop.append(f)
    rep.update(dropped=len(drop), kept_untracked=kept_untracked, kept_uncollected=kept_uncollected)
    readme = folder / "README.md"
    if not readme.exists():
        rep["error"] = "no README.md"
    elif drop and not dry:
        rep["readme_note"] = add_note(readme, note_line(commit, in_repo, date, bool(entries)))
    if not dry:
        for f in drop:
            (folder / f).unlink()
        for root, dirs, files in sorted(os.walk(folder), key=lambda t: -len(t[0])):
            if root != str(folder) and not os.listdir(root):
                os.rmdir(root)
    return rep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="results/<date-name> folders")
    ap.add_argument("--commit", help="commit holding the raw files (default: HEAD)")
    ap.add_argument("--date", default=datetime.date.today().isoformat(), help="date in the README note")
    ap.add_argument("--max-bytes", type=int, default=1_000_000,
                    help="above this, drop per-sample / per-kernel series from runs.json")
    ap.add_argument("--dry-run", action="store_true", help="report only; write and remove nothing")
    a = ap.parse_args()
    ok = True
    for d in a.folders:
        folder = Path(d)
        if not folder.is_dir():
            print(f"{d}: not a folder", file=sys.stderr)
            ok = False
            continue
        repo = Path(_git(folder, "rev-parse", "--show-toplevel").strip()).resolve()
        commit = _git(repo, "rev-parse", a.commit or "HEAD").strip()
        rep = compact(folder, commit, repo, a.date, a.max_bytes, a.dry_run)
        ok = ok and "error" not in rep and not rep["kept_uncollected"]
        print(json.dumps(rep))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

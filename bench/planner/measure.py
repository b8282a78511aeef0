"""``measure_top=K``: run the planner's first K layouts for real, as one ordinary bench sweep, and put each
measurement beside its prediction; the fastest measured setting of each strategy goes into the user's store of
measured bests (bench/plan/bests.py), where ``tuning=best`` finds it.

Each row becomes a config of its own (``<out>/conf/planned/row<rank>.yaml``, a sweep arm like
conf/experiment/arm/) and the sweep is ``python -m bench --multirun hydra.searchpath=[file://<out>/conf]
+planned=row1,row2,... <the job's keys> <measure_with>``: the bench sweeper plans, records and resumes it as any
other, locally or with ``measure_with=[hydra/launcher=slurm]``.  ``measure_with`` keys replace the job's own
(e.g. ``[hardware=auto,device=cpu]`` to try the mechanism on a CPU: the runs then say they ran there).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from bench.run.runs import read_result
from bench.spec.commands import override_key, rerun_command

SUBDIR = "measure"


def arm_yaml(own: list[str]) -> str:
    """A row's own overrides as a ``# @package _global_`` config (its strategy as a defaults-list override)."""
    strategy = [o.split("=", 1)[1] for o in own if override_key(o) == "strategy"]
    rest = [o for o in own if override_key(o) != "strategy"]
    body = OmegaConf.to_yaml(OmegaConf.from_dotlist(rest)) if rest else ""
    head = f"defaults:\n  - override /strategy: {strategy[0]}\n" if strategy else ""
    return f"# @package _global_\n# written by python -m bench.planner measure_top\n{head}{body}"


def sweep_command(names: list[str], conf: Path, common: list[str], measure_with: list[str], sweep: Path,
                  config_dirs: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The sweep that measures the rows: their arms' folder and the user's config dirs (--config-dir) searched."""
    if "device=cpu" in measure_with and not any(override_key(o) == "allocator" for o in measure_with):
        measure_with = [*measure_with, "allocator=default"]  # measured on CPU: no CUDA allocator to set
    replaced = {override_key(o) for o in measure_with}
    job = [o for o in common if override_key(o) not in replaced] + list(measure_with)
    path = ",".join(f"file://{d}" for d in (str(conf.resolve()), *config_dirs))
    return [sys.executable, "-m", "bench", "--multirun", f"hydra.searchpath=[{path}]",
            f"+planned={','.join(names)}", *job, f"hydra.sweep.dir={sweep.resolve()}"]


def _measured(sweep: Path) -> dict[int, dict]:
    """Job number -> that run's metrics.json (run folders are ``<num>_<key>``, numbered in the sweep's order)."""
    out = {}
    for d in sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.split("_", 1)[0].isdigit()):
        r = read_result(d)
        m = json.loads((d / "metrics.json").read_text()) if (d / "metrics.json").is_file() else None
        if r is not None and m is not None:
            out[int(d.name.split("_", 1)[0])] = {**m, "run_dir": str(d)}
    return out


def beside(picks: list[dict], runs: dict[int, dict]) -> list[dict]:
    """Predicted beside measured, one record a row."""
    out = []
    for i, r in enumerate(picks):
        m = runs.get(i) or {}
        tput, mem = m.get("throughput") or {}, m.get("memory") or {}
        measured = tput.get("tokens_per_s")
        out.append({"rank": r["rank"], "status": m.get("status", "not run"),
                    "predicted_tokens_per_s": r["tokens_per_s"],
                    "measured_tokens_per_s": measured, "measured_over_predicted":
                        round(measured / r["tokens_per_s"], 3) if measured and r["tokens_per_s"] else None,
                    "planned_peak_gib": r["peak_gib"], "measured_peak_gib":
                        round(mem["max_allocated_mb"] / 1024, 2) if mem.get("max_allocated_mb") is not None else None,
                    "device": ((m.get("provenance") or {}).get("devices") or [None])[0],
                    "run_dir": m.get("run_dir"), "command": r["command"]})
    return out


def record_winners(runs: dict[int, dict], commands: dict[int, str], source: str) -> Optional[Path]:
    """The fastest completed run of each strategy identity into the user's store (bench/plan/bests.py ``record``)."""
    from bench.plan import bests
    from bench.run.config import describe_run
    from bench.strategies.registry import get_spec

    best: dict[str, tuple[dict, int, Any]] = {}
    for num, m in runs.items():
        if m.get("status") != "completed" or not (m.get("throughput") or {}).get("tokens_per_s"):
            continue
        spec = get_spec(describe_run(m["config"]).strategy.name)
        # the recorded strategy section as the store keys it (bench/plan/bests.py: a record's keys, its defaults)
        ident = json.dumps(bests.stored_identity(spec, m["config"]["strategy"]), sort_keys=True, default=str)
        if ident not in best or m["throughput"]["tokens_per_s"] > best[ident][0]["throughput"]["tokens_per_s"]:
            best[ident] = (m, num, spec)
    entries = [bests.entry(spec, m, m, m["throughput"]["tokens_per_s"], True,
                           source=source, command=commands[num], measured={"dir": m["run_dir"]})
               for m, num, spec in best.values()]
    return bests.record(entries) if entries else None


def _print(rows: list[dict]) -> None:
    print(f"{'rank':>4}  {'status':<10} {'predicted':>10} {'measured':>10} {'ratio':>6} {'plan GiB':>8} "
          f"{'peak GiB':>8}  device")
    for r in rows:
        num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        print(f"{r['rank']:>4}  {r['status']:<10} {num(r['predicted_tokens_per_s'], ',.0f'):>10} "
              f"{num(r['measured_tokens_per_s'], ',.0f'):>10} {num(r['measured_over_predicted'], '.2f'):>6} "
              f"{r['planned_peak_gib']:>8.1f} {num(r['measured_peak_gib'], '.2f'):>8}  {r['device'] or '-'}")


def measure(q, head: dict, records: list[dict], folder: Path) -> int:
    """Run the first ``q.measure_top`` rows that can run (fits or tight); print and write predicted beside measured."""
    from bench.jsonio import write_json_atomic

    picks = [r for r in records if r["verdict"] in ("fits", "tight")][:q.measure_top]
    if not picks:
        print("measure_top: no layout fits: nothing to measure")
        return 3
    common = head["common_overrides"]
    conf = folder / "conf" / "planned"
    conf.mkdir(parents=True, exist_ok=True)
    names = []
    for r in picks:
        names.append(f"row{r['rank']}")
        (conf / f"{names[-1]}.yaml").write_text(arm_yaml([o for o in r["overrides"] if o not in common]))
    sweep = folder / SUBDIR
    cmd = sweep_command(names, conf.parent, common, q.measure_with, sweep, q.config_dirs)
    print("measuring: " + " ".join(cmd[2:]), flush=True)
    rc = subprocess.run(cmd).returncode
    runs = _measured(sweep) if sweep.is_dir() else {}
    rows = beside(picks, runs)
    _print(rows)
    write_json_atomic(folder / "measured.json", {"command": cmd, "returncode": rc, "rows": rows})
    replaced = {override_key(o) for o in q.measure_with}
    commands = {i: rerun_command([o for o in r["overrides"] if override_key(o) not in replaced] + list(q.measure_with))
                for i, r in enumerate(picks)}
    store = record_winners(runs, commands, str(sweep))
    print(f"written: {folder / 'measured.json'}" + (f"; measured winners recorded in {store}" if store else ""))
    return rc

"""The end-of-sweep status report and exit code (the SUMMARY lines, summary.json), read from its folder,
not from a sweeper's memory: ``sweep.json`` (the plan: every job and what was decided for it) and
``summary.json`` (the outcome); also the progress line of a running sweep."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from bench.jsonio import read_json_dict, write_json_atomic
from bench.run.runs import read_result, scan

log = logging.getLogger("bench.sweep")

MANIFEST = "sweep.json"
SUMMARY = "summary.json"


def progress(sweep_dir: Path, upto: list) -> str:
    """The statuses so far of a sweep's jobs (a progress line)."""
    c: dict[str, int] = {}
    for j in upto:
        r = read_result(sweep_dir / j.dir)
        s = r.status if r else "unknown"
        c[s] = c.get(s, 0) + 1
    return ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or "none yet"


def summarize(sweep_dir: Path, manifest: Optional[dict] = None) -> dict:
    """Counts and per-run lines of a sweep folder (the manifest's jobs - ``manifest``, this sweep's own
    plan, else the folder's sweep.json, which another sweep process may have written since -; else
    every run folder)."""
    man = manifest or read_json_dict(sweep_dir / MANIFEST)
    rows = []
    if man:
        for j in man["jobs"]:
            r = read_result(sweep_dir / j["dir"]) if j.get("dir") else None
            status = r.status if r else "unknown"
            rows.append({**j, "status": status, "resumed": j["action"] == "skip",
                         "wall_s": (r.info.get("wall_s") if r else None),
                         "overhead_s": (r.info.get("overhead_s") if r else None),
                         "outside_steps_s": (r.info.get("outside_steps_s") if r else None),
                         "reason": (r.info.get("reason") if r and r.info.get("reason") else j.get("reason"))})
    else:
        for r in scan(sweep_dir):
            rows.append({"num": None, "dir": r.dir.name, "key": r.key, "action": "run", "status": r.status,
                         "resumed": False, **{k: r.info.get(k) for k in ("model", "strategy", "world_size",
                                                                         "wall_s", "overhead_s", "outside_steps_s",
                                                                         "reason")}})
    counts = {s: 0 for s in ("completed", "invalid", "skipped", "failed", "oom", "timeout", "interrupted",
                             "pending", "unknown")}
    for row in rows:
        # pending: never started (the sweep stopped); running/None: started but never reported its end
        counts[row["status"] if row["status"] in counts else "unknown"] += 1
    resumed = sum(r["resumed"] for r in rows)
    return {"sweep_dir": str(sweep_dir), "runs": len(rows), "counts": counts, "resumed": resumed, "rows": rows,
            "gpu_time": gpu_time(rows)}


def gpu_time(rows: list) -> dict:
    """Device-minutes this sweep's runs held (wall time x world size, resumed runs left out) and the part spent
    outside the ranks' steps (start, set-up, the warm-up's compile and capture, teardown: each run's
    outside_steps_s, or its fixed overhead_s where the warm-up was not timed)."""
    ran = [r for r in rows if not r.get("resumed") and r.get("wall_s") and isinstance(r.get("world_size"), int)]
    total = sum(r["wall_s"] * r["world_size"] for r in ran) / 60
    overhead = sum(_outside(r) * r["world_size"] for r in ran) / 60
    return {"runs": len(ran), "device_minutes": round(total, 2), "overhead_minutes": round(overhead, 2)}


def _outside(row: dict) -> float:
    """A run's seconds outside its steps (0 where it never reached one)."""
    return row.get("outside_steps_s") or row.get("overhead_s") or 0.0


def exit_code_of(summary: dict, interrupted: bool) -> int:
    """130 interrupted; 1 a run failed, ran out of memory, timed out or never reported; 2 (3) no run could run:
    every one was invalid (or predicted not to fit, none invalid); else 0."""
    c = summary["counts"]
    if interrupted or c["interrupted"]:
        return 130
    if c["failed"] or c["oom"] or c["timeout"] or c["unknown"]:
        return 1
    if summary["runs"] and c["invalid"] + c["skipped"] == summary["runs"]:
        return 2 if c["invalid"] else 3
    return 0


NOT_RUN = ("invalid", "skipped")  # recorded without running: listed by reason, not one line per run


def job_numbers(nums: list) -> str:
    """``#0-#74`` / ``#1, #4, #7-#9``: job numbers in ranges (at most 12 ranges, then how many more)."""
    nums = sorted(n for n in nums if isinstance(n, int))
    spans: list[list[int]] = []
    for n in nums:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    text = [f"#{a}" if a == b else f"#{a}-#{b}" for a, b in spans]
    return ", ".join(text[:12]) + (f", ... ({len(text) - 12} more)" if len(text) > 12 else "")


def reason_lines(items: list[tuple[str, Optional[int], Optional[str]]], prefix: str = "[sweep]   ") -> list[str]:
    """One line per distinct (status, reason) of ``items`` - (status, job number, reason) -, with how many runs
    and which: a reason shared by 75 runs is printed once."""
    groups: dict[tuple[str, str], list] = {}
    for status, num, reason in items:
        first = str(reason).splitlines()[0] if reason else "no reason recorded"
        groups.setdefault((status, first), []).append(num)
    return [f"{prefix}{len(nums)} {status} ({job_numbers(nums)}): {why[:600]}"
            for (status, why), nums in groups.items()]


def format_summary(s: dict, code: int) -> list[str]:
    c = s["counts"]
    lines = [f"[sweep] SUMMARY {s['runs']} runs: completed={c['completed']} invalid={c['invalid']} "
             f"skipped={c['skipped']} failed={c['failed']} oom={c['oom']} timeout={c['timeout']} "
             f"interrupted={c['interrupted']} "
             f"not_run={c['pending']} unknown={c['unknown']} (resumed={s['resumed']}, skipped as invalid="
             f"{c['invalid']}) exit={code}"]
    for r in s["rows"]:
        if r["status"] in NOT_RUN:
            continue
        ident = f"{r.get('model')}/{r.get('strategy')} ws={r.get('world_size')}"
        wall = f" {r['wall_s']:.1f} s" if r.get("wall_s") else ""
        over = f" ({_outside(r):.1f} s outside the steps)" if _outside(r) else ""
        tag = " [resumed]" if r["resumed"] else ""
        lines.append(f"[sweep]   #{r.get('num')} {r.get('dir')}/ {r['status']:<11} {ident}{wall}{over}{tag}")
    lines += reason_lines([(r["status"], r.get("num"), r.get("reason")) for r in s["rows"]
                           if r["status"] != "completed"])
    g = s.get("gpu_time") or {}
    if g.get("runs"):
        share = g["overhead_minutes"] / g["device_minutes"] if g["device_minutes"] else 0.0
        lines.append(f"[sweep] device time: {g['device_minutes']:.1f} device-minutes over {g['runs']} runs (wall x "
                     f"world size), {g['overhead_minutes']:.1f} of them ({share:.0%}) outside the steps (start, "
                     "set-up, the warm-up's compile and capture, teardown)")
    lines.append(f"[sweep] results in {s['sweep_dir']}")
    return lines


def waits(config: DictConfig) -> bool:
    """Whether the sweep's launcher waited for its jobs (hydra.launcher.wait=false: submit and walk away)."""
    return OmegaConf.select(config, "hydra.launcher.wait", default=True) is not False


def queued_report(sweep_dir: Path, s: dict) -> tuple[list[str], int]:
    """Lines and exit code of a sweep whose jobs were left queued (hydra.launcher.wait=false): their job ids, the
    sweep folder and the command that reports them; runs bench recorded without a job, by reason."""
    from bench.launch.slurm.record import QUEUED

    queued = read_json_dict(sweep_dir / QUEUED) or {}
    ids = [queued[str(r.get("num"))]["job_id"] for r in s["rows"] if str(r.get("num")) in queued
           and r["status"] in ("pending", "running", "unknown")]
    c = s["counts"]
    lines = [f"[sweep] QUEUED {len(ids)} of {s['runs']} runs as SLURM jobs {', '.join(ids)} in {sweep_dir} "
             f"(invalid={c['invalid']} skipped={c['skipped']} failed={c['failed']} resumed={s['resumed']})"]
    lines += reason_lines([(r["status"], r.get("num"), r.get("reason")) for r in s["rows"]
                           if r["status"] in (*NOT_RUN, "failed")])
    lines.append(f"[sweep] this process may end, the jobs run on; their report: python -m bench.sweep.collect "
                 f"{sweep_dir} (--wait: until they are over, then the analysis)")
    return lines, (1 if c["failed"] else 0)


class SweepCallback(Callback):
    """Summary and exit code of a multirun (registered in conf/config.yaml, hydra.callbacks); what the
    sweep did is read from its folder (the manifest), not from the sweeper's memory."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if OmegaConf.select(config, "hydra.sweeper.dry_run", default=False) or config.get("dry_run"):
            return
        sweep_dir = Path(str(config.hydra.sweep.dir))
        man = read_json_dict(sweep_dir / MANIFEST) or {}
        s = summarize(sweep_dir)
        if not waits(config) and (sweep_dir / "queued.json").exists():
            lines, code = queued_report(sweep_dir, s)
            for line in lines:
                log.info(line)
            sys.stdout.flush()
            if code:
                raise SystemExit(code)
            return
        code = exit_code_of(s, bool(man.get("interrupted")))
        s["exit_code"] = code
        write_json_atomic(sweep_dir / SUMMARY, {k: v for k, v in s.items()})
        for line in format_summary(s, code):
            log.info(line)
        sys.stdout.flush()
        if code:
            raise SystemExit(code)

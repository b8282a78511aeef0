"""``python -m bench.sweep.collect <sweep dir> [--wait] [--poll-s S] [--no-analysis]``: the report of a sweep
submitted without waiting (``hydra/launcher=slurm hydra.launcher.wait=false``), from its folder, in any later
login session.

Each job the sweep left queued (``<sweep dir>/queued.json``: run folder and SLURM job id) gets its status from
its run's record where the run wrote a final one, else from SLURM (``squeue``): queued or running (state and
reason), or over without a final status - then the run is recorded as the waiting launcher would have recorded
it (``timeout`` for SLURM's time limit, ``oom``, else ``failed``, with SLURM's state); a job pending for a reason
SLURM will never get past is cancelled and recorded ``failed``.  Then the sweep's summary (as a sweep that
waited prints it).  Once no job is queued or running it writes ``summary.json``, exits as the sweep would have
(docs/sweeps.md, Exit codes) and, where a run completed, runs ``python -m multirun_analysis`` on the folder;
while jobs are still queued or running it exits 0 (``--wait``: polls every ``--poll-s`` seconds until none is).
"""
from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from bench.jsonio import read_json_dict, write_json_atomic
from bench.launch.slurm.collect import ACTIVE, NEVER_STARTS, ended_without_status, never_starts, squeue_states
from bench.launch.slurm.record import QUEUED, mark_failed
from bench.run.runs import STATUSES as FINAL
from bench.run.runs import read_result
from bench.sweep.status_report import SUMMARY, exit_code_of, format_summary, summarize

log = logging.getLogger("bench.sweep")


def _run_config(d: Path) -> DictConfig:
    """The run's composed config (Hydra's .hydra/config.yaml, written where the job started), else empty."""
    try:
        return OmegaConf.load(d / ".hydra" / "config.yaml")  # type: ignore[return-value]
    except (OSError, ValueError):
        return OmegaConf.create({})


def _stderr_tail(sweep_dir: Path, jid: str) -> str:
    """The last lines of the job's first task's stderr (submitit's log), if any."""
    try:
        err = (sweep_dir / ".submitit" / jid / f"{jid}_0_log.err").read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    tail = " | ".join(line.strip() for line in err[-5:] if line.strip())
    return f"; its stderr ends: {tail}" if tail else ""


def check(sweep_dir: Path) -> list[str]:
    """Look at every queued job once; record the runs whose jobs are over without a final status.  Returns one
    line per job still queued or running (SLURM's state and reason)."""
    queued = read_json_dict(sweep_dir / QUEUED) or {}
    open_jobs = {}
    for num, q in queued.items():
        r = read_result(sweep_dir / q["dir"])
        if not (r and r.status in FINAL):
            open_jobs[str(q["job_id"])] = (num, q)
    if not open_jobs:
        return []
    states = squeue_states(list(open_jobs))
    if states is None:
        return [f"#{num} {q['dir']}/: SLURM job {jid}: squeue could not say (is this the cluster's login node?)"
                for jid, (num, q) in open_jobs.items()]
    active = []
    for jid, (num, q) in open_jobs.items():
        d, st = sweep_dir / q["dir"], states.get(jid)
        if st and st[0] in ACTIVE and not never_starts(st):
            active.append(f"#{num} {q['dir']}/: SLURM job {jid} {st[0]} ({st[1]})")
            continue
        if never_starts(st):
            subprocess.run(["scancel", jid], capture_output=True, timeout=60)
        r = read_result(d)  # the run may have written its final status since the first look
        if r and r.status in FINAL:
            continue
        status, msg = ended_without_status(jid, st)
        if st is None:  # squeue forgets a job MinJobAge (300 s by default) after its end
            msg = (f"SLURM job {jid} is over (squeue no longer lists it) and its run recorded no final status: ended "
                   f"by its time limit, scancel, a node failure or a crash before rank 0 recorded{_stderr_tail(sweep_dir, jid)}")
        mark_failed(d, _run_config(d), msg, r.info if r else {}, status)
        log.error("[collect] #%s %s/: %s", num, q["dir"], msg)
    return active


def collect(sweep_dir: Path, wait: bool = False, poll_s: float = 10.0, analysis: bool = True) -> int:
    """Report (and record) the sweep in ``sweep_dir``; its exit code."""
    if not (sweep_dir / QUEUED).exists():
        print(f"bench: {sweep_dir}: no {QUEUED} (a sweep submitted with hydra.launcher.wait=false writes it)",
              file=sys.stderr)
        return 2
    active = check(sweep_dir)
    while wait and active:
        log.info("[collect] %d job(s) queued or running; next look in %.0f s", len(active), poll_s)
        time.sleep(poll_s)
        active = check(sweep_dir)
    s = summarize(sweep_dir)
    if active:
        for line in active:
            log.info("[collect]   %s", line)
        log.info("[collect] %d of %d runs still queued or running (--wait waits for them); the rest: %s", len(active),
                 s["runs"], ", ".join(f"{v} {k}" for k, v in s["counts"].items() if v and k not in ("pending", "unknown")))
        return 0
    code = exit_code_of(s, False)
    s["exit_code"] = code
    write_json_atomic(sweep_dir / SUMMARY, s)
    for line in format_summary(s, code):
        log.info(line)
    if analysis and s["counts"]["completed"]:
        subprocess.run([sys.executable, "-m", "multirun_analysis", str(sweep_dir)], check=False)
    return code


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sweep.collect", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", type=Path, help="the sweep's folder (hydra.sweep.dir)")
    ap.add_argument("--wait", action="store_true", help="poll until no job is queued or running")
    ap.add_argument("--poll-s", type=float, default=10.0, help="seconds between looks with --wait (default 10)")
    ap.add_argument("--no-analysis", action="store_true", help="do not run python -m multirun_analysis at the end")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return collect(a.sweep_dir, a.wait, a.poll_s, not a.no_analysis)


if __name__ == "__main__":
    sys.exit(main())

"""One Hydra job = one benchmark run: validate -> launch -> record.

The run folder Hydra created holds everything of the run: ``status.json`` (pending - written by
the sweeper -, running, then the final status; with the run key, model/strategy/world size, wall
time and fixed overhead), ``metrics.json`` (always written, with the status; measurements null
unless completed; its ``job`` section has the run key, wall time and overhead), the ranks'
``rank{r}.json`` / ``rank{r}.log`` and, on failure, ``failure_rank{r}.json``.  A failing run
never stops a sweep: the job returns its status.  Only an interrupted run (Ctrl-C) stops it
(bench/sweep.py).  A folder that holds a completed result is never written over.

Fixed overhead per run (``job`` in metrics.json, and status.json): ``startup_s`` = job start
(the task function) -> rank 0 starts its first step (process spawn, imports, process group,
model build, strategy setup); ``teardown_s`` = rank 0 ends its last step -> the job has recorded
everything (gather, metrics, process group teardown, process exit); ``overhead_s`` = both.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from bench import metrics
from bench.config import ConfigError, validate
from bench.metrics.io import read_json_dict, write_json_atomic
from bench.sweep import holds_completed, identity, run_key

log = logging.getLogger("bench")


def write_status(run_dir: Path, status: str, **extra) -> None:
    write_json_atomic(run_dir / "status.json", {"status": status, "time": time.time(), **extra})


def job_timing(run_dir: Path, t0: float, t_end: float) -> dict:
    """Wall time and fixed overhead of a run (from rank 0's step timestamps, when it got that far)."""
    r0 = read_json_dict(run_dir / "rank0.json") or {}
    start = r0.get("t_first_step")
    end = r0.get("t_loop_end")
    startup = start - t0 if start else None
    teardown = t_end - end if end else None
    return {"wall_s": t_end - t0, "startup_s": startup, "teardown_s": teardown,
            "overhead_s": startup + teardown if startup is not None and teardown is not None else None}


def finish(run_dir: Path, raw: dict, status: str, error: Optional[dict], failures: list, base: dict,
           t0: float) -> str:
    """Write the final metrics.json (the workers' one when completed) and status.json."""
    mpath = run_dir / "metrics.json"
    m = read_json_dict(mpath) if status == "completed" else None
    if m is None or m.get("status") != "completed":
        if status == "completed":  # the ranks ended well but rank 0's metrics.json is missing
            status, error = "failed", {"rank": 0, "type": "MissingMetrics",
                                       "message": "all ranks exited 0 but metrics.json was not written",
                                       "traceback": None}
        m = metrics.skeleton(raw, status if status in metrics.STATUSES else "failed", error)
        m["failures"] = failures
    timing = job_timing(run_dir, t0, time.time())
    m["job"] = {"key": base["key"], **timing}
    write_json_atomic(mpath, m)
    extra = {"reason": (error or {}).get("message")} if m["status"] != "completed" else {}
    write_status(run_dir, m["status"], **base, **timing, **extra)
    if error and error.get("traceback"):
        log.error("rank %s failed:\n%s", error.get("rank"), error["traceback"])
    log.info(metrics.one_line(m))
    if timing["overhead_s"] is not None:
        log.info("wall %.1f s, fixed overhead %.1f s (launch -> first step %.1f s, last step -> done %.1f s)",
                 timing["wall_s"], timing["overhead_s"], timing["startup_s"], timing["teardown_s"])
    return m["status"]


def begin(cfg: DictConfig, run_dir: Path) -> tuple[dict, dict]:
    raw = OmegaConf.to_container(cfg, resolve=True)
    base = {"key": run_key(raw), **identity(raw), "t_start": time.time()}
    return raw, base


def record_invalid(run_dir: Path, raw: dict, base: dict, e: ConfigError, t0: float) -> str:
    log.error("%s", e)
    return finish(run_dir, raw, "invalid", {"rank": None, "type": "ConfigError", "message": str(e),
                                           "traceback": None, "key": e.key, "value": e.value}, [], base, t0)


def run(cfg: DictConfig, run_dir: Path, command: list[str], t0: Optional[float] = None) -> str:
    """Run one benchmark into run_dir; returns its final status."""
    from bench.launch import launch_local

    t0 = time.time() if t0 is None else t0
    run_dir.mkdir(parents=True, exist_ok=True)
    if holds_completed(run_dir):
        log.error("%s already holds a completed result: not running into it (use another folder)", run_dir)
        return "refused"
    raw, base = begin(cfg, run_dir)
    write_status(run_dir, "running", **base)
    try:
        try:
            plan = validate(cfg)
        except ConfigError as e:
            return record_invalid(run_dir, raw, base, e, t0)
        plan.cfg["_command"] = command
        log.info("run %s: model=%s strategy=%s world_size=%d device=%s backend=%s precision=%s",
                 run_dir, plan.model["name"], plan.strategy["name"], plan.world_size, plan.device,
                 plan.backend, raw["precision"])
        outcome = launch_local(plan, run_dir)
        return finish(run_dir, raw, outcome.status, outcome.error, outcome.failures, base, t0)
    except KeyboardInterrupt:
        from bench.launch import read_failures

        finish(run_dir, raw, "interrupted", {"rank": None, "type": "KeyboardInterrupt",
                                             "message": "interrupted (Ctrl-C)", "traceback": None},
               read_failures(run_dir), base, t0)
        raise


def exit_code(status: str) -> int:
    return {"completed": 0, "invalid": 2, "interrupted": 130}.get(status, 1)

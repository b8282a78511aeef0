"""One Hydra job = one benchmark run: validate -> launch -> record.

The run folder Hydra created holds everything of the run: ``status.json`` (running, then
the final status), ``metrics.json`` (always written, with the status; measurements null
unless completed), the ranks' ``rank{r}.json`` / ``rank{r}.log`` and, on failure,
``failure_rank{r}.json``.  A failing run never stops a sweep: the job returns its status.
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bench import metrics
from bench.config import ConfigError, validate
from bench.metrics.io import read_json, write_json_atomic

log = logging.getLogger("bench")


def write_status(run_dir: Path, status: str, **extra) -> None:
    write_json_atomic(run_dir / "status.json", {"status": status, "time": time.time(), **extra})


def run(cfg: DictConfig, run_dir: Path, command: list[str]) -> str:
    """Run one benchmark into run_dir; returns its final status."""
    from bench.launch import launch_local

    run_dir.mkdir(parents=True, exist_ok=True)
    raw = OmegaConf.to_container(cfg, resolve=True)
    write_status(run_dir, "running")
    try:
        plan = validate(cfg)
    except ConfigError as e:
        log.error("%s", e)
        m = metrics.skeleton(raw, "invalid", {"rank": None, "type": "ConfigError", "message": str(e),
                                              "traceback": None, "key": e.key, "value": e.value})
        write_json_atomic(run_dir / "metrics.json", m)
        write_status(run_dir, "invalid", reason=str(e))
        return "invalid"

    plan.cfg["_command"] = command
    log.info("run %s: model=%s strategy=%s world_size=%d device=%s backend=%s precision=%s",
             run_dir, plan.model["name"], plan.strategy["name"], plan.world_size, plan.device,
             plan.backend, raw["precision"])
    outcome = launch_local(plan, run_dir)
    mpath = run_dir / "metrics.json"
    if outcome.status == "completed":
        m = read_json(mpath)
    else:
        m = metrics.skeleton(raw, outcome.status if outcome.status in metrics.STATUSES else "failed",
                             outcome.error)
        m["failures"] = outcome.failures
        write_json_atomic(mpath, m)
        if outcome.error and outcome.error.get("traceback"):
            log.error("rank %s failed:\n%s", outcome.error.get("rank"), outcome.error["traceback"])
    write_status(run_dir, m["status"])
    log.info(metrics.one_line(m))
    return m["status"]


def exit_code(status: str) -> int:
    return {"completed": 0, "invalid": 2}.get(status, 1)


def main_task(cfg: DictConfig) -> str:
    """The Hydra task function (single run and each multirun job)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    status = run(cfg, Path(hc.runtime.output_dir), [sys.executable, "-m", "bench", *sys.argv[1:]])
    if hc.mode == RunMode.RUN and status != "completed":
        # a single run reports failure through its exit code; a sweep goes on
        raise SystemExit(exit_code(status))
    return status

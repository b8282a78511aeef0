"""The Hydra task function: where one job of ``python -m bench`` runs.

Locally (every run, and each job of a sweep) it is bench/job.py's run(): validate, launch
the ranks, record.  Inside a submitit/SLURM task this process is itself one rank, and
bench/slurm.py's run_task() takes over.  A single run reports a failure through its exit
code; in a sweep the status is returned and the sweep goes on.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from bench.job import dry_run, exit_code, run


def main_task(cfg: DictConfig) -> str:
    """The Hydra task function (single run and each multirun job, local or under submitit/SLURM)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    t0 = time.time()
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    # the command that repeats this one run (a sweep's argv would repeat the whole sweep)
    overrides = list(hc.overrides.task)
    command = [sys.executable, "-m", "bench", *overrides]
    explicit = [o.split("=", 1)[0].lstrip("+~") for o in overrides]  # with tuning=best these win
    try:
        if cfg.get("dry_run"):
            status = dry_run(cfg, run_dir, explicit)
        elif os.environ.get("SUBMITIT_EXECUTOR"):  # this process is one rank of a submitit/SLURM task
            from bench import slurm  # imports submitit: only needed here

            status = slurm.run_task(cfg, run_dir, command, t0, explicit)
        else:
            status = run(cfg, run_dir, command, t0, explicit)
    except KeyboardInterrupt:
        if hc.mode == RunMode.RUN:
            raise SystemExit(130)
        raise  # the sweeper stops the sweep
    if hc.mode == RunMode.RUN and status != "completed":
        # a single run reports failure through its exit code; a sweep goes on
        raise SystemExit(exit_code(status))
    return status

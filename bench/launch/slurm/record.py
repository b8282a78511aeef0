"""A run's folder and its record when bench, not the run, has to give it a final status (sbatch refused
the job, the job died before rank 0 could record, Ctrl-C in the sweep): the sweep goes on with it."""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict

from bench.jsonio import read_json_dict, write_json_atomic

log = logging.getLogger("bench.slurm")

QUEUED = "queued.json"  # <sweep dir>/queued.json: the jobs a sweep submitted without waiting (hydra.launcher.wait=false)


def job_dir(sc: DictConfig, num: int) -> Path:
    """The run folder of job ``num`` of the sweep config ``sc`` (hydra.sweep.dir / hydra.sweep.subdir)."""
    with open_dict(sc):
        sc.hydra.job.num = num
    return Path(str(sc.hydra.sweep.dir)) / str(OmegaConf.select(sc, "hydra.sweep.subdir"))


def mark_failed(d: Path, sc: DictConfig, message: str, info: dict, status: str = "failed") -> None:
    """Give the run in ``d`` a final status (``failed`` unless said) with ``message`` as its reason,
    unless the run recorded one itself; the ranks' failure records, if any, name the root cause."""
    from bench.run.runs import mark_unfinished, read_failures

    d.mkdir(parents=True, exist_ok=True)
    try:
        task = OmegaConf.to_container(sc, resolve=True)
        task.pop("hydra", None)
    except Exception:
        task = {}
    if info and not (d / "status.json").exists():
        write_json_atomic(d / "status.json", info)
    err_type = {"timeout": "SlurmTimeLimit", "interrupted": "KeyboardInterrupt"}.get(status, "JobFailure")
    mark_unfinished(d, task, status, err_type, message, read_failures(d))


def leave_queued(executor: str, sweep_dir: Path, submitted: list) -> dict:
    """hydra.launcher.wait=false: record the submitted jobs (num, overrides, sweep config, submitit job) in
    ``<sweep dir>/queued.json`` - run folder and job id, what ``python -m bench.sweep.collect`` follows - and return
    without waiting; each run's JobReturn says ``queued``."""
    queued = read_json_dict(sweep_dir / QUEUED) or {}
    out = {}
    for num, overrides, sc, job in submitted:
        queued[str(num)] = {"dir": job_dir(sc, num).name, "job_id": str(job.job_id), "executor": executor,
                            "submitted": time.time(), "overrides": [o for o in overrides
                                                                    if not o.startswith("hydra.sweep.subdir=")]}
        ret = JobReturn(overrides=overrides, working_dir=os.getcwd(), task_name="bench")
        ret.return_value, ret.status = "queued", JobStatus.COMPLETED
        out[num] = ret
    write_json_atomic(sweep_dir / QUEUED, queued)
    return out

"""When each submitted job is over, and the status of its run.  Over is SLURM's word: ``squeue -t all``
every few seconds (a job in a final state, or no longer listed).  submitit asks ``sacct``, which needs
SLURM's accounting database: without one, a job that ended without submitit's result file (time limit,
scancel, node failure, bench's own watchdog, which ends the processes with os._exit) was never seen to
end and the sweep waited forever; with one, only after submitit's polling delay (up to 10 minutes).
A run its job left without a final status gets one from SLURM's last state.  A job SLURM will never
start as the cluster is configured (pending with a reason in NEVER_STARTS: more nodes, CPUs or time than
its partition has; sbatch accepts such a job unless the cluster sets EnforcePartLimits) is cancelled and
its run recorded ``failed`` with SLURM's reason, instead of the sweep waiting for it forever."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig

from bench.launch.slurm.record import job_dir, log, mark_failed

# SLURM job states of a job that is not over yet (squeue %T); any other state, or a job squeue no longer
# lists (MinJobAge after its end), is over
ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
          "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}

# squeue reasons (%r) of a PENDING job that SLURM will not start while the cluster's configuration stays as it
# is: the job itself asks for more than its partition, account or QOS can give.  Not the passing ones
# (Resources, Priority, ReqNodeNotAvail, PartitionNodeLimit, which also means "its nodes are DOWN now", ...).
NEVER_STARTS = {
    "PartitionConfig": "the partition cannot hold it: more nodes, or CPUs per node, than it has",
    "PartitionTimeLimit": "its time limit exceeds the partition's",
    "BadConstraints": "its constraints cannot be satisfied",
    "InvalidAccount": "invalid account", "InvalidQOS": "invalid QOS",
    "DependencyNeverSatisfied": "a dependency that can never be satisfied",
    "QOSMaxNodePerJobLimit": "more nodes than its QOS allows a job",
    "QOSMaxCpuPerJobLimit": "more CPUs than its QOS allows a job",
    "QOSMaxGRESPerJob": "more GRES (GPUs) than its QOS allows a job",
    "QOSMaxWallDurationPerJobLimit": "a longer time limit than its QOS allows",
    "AssocMaxNodesPerJobLimit": "more nodes than its association allows a job",
    "AssocMaxCpuPerJobLimit": "more CPUs than its association allows a job",
    "AssocMaxWallDurationPerJobLimit": "a longer time limit than its association allows",
}


def never_starts(queued: Optional[tuple[str, str]]) -> bool:
    return bool(queued) and queued[0] == "PENDING" and queued[1] in NEVER_STARTS


class NoResult(Exception):
    """The job ended without submitit's result file: its stderr's tail says what happened."""

    def __init__(self, job) -> None:
        tail = ""
        try:
            err = Path(job.paths.stderr).read_text(errors="replace").strip().splitlines()[-15:]
            tail = " | ".join(line for line in err if line.strip())
        except OSError:
            pass
        super().__init__(f"the job was ended before the task could report (no {Path(job.paths.result_pickle).name})"
                         + (f"; its stderr ends: {tail}" if tail else ""))


def squeue_states(job_ids: list[str]) -> Optional[dict[str, tuple[str, str]]]:
    """squeue's state and reason of each job it still lists (``-t all``: ended ones too, for MinJobAge),
    or None where squeue fails (then submitit decides, through sacct)."""
    out: dict[str, tuple[str, str]] = {}
    for i in range(0, len(job_ids), 200):
        chunk = job_ids[i:i + 200]
        try:
            p = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(chunk), "-o", "%i|%T|%r"],
                               capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("[slurm] squeue failed (%s): asking submitit (sacct) instead", e)
            return None
        if p.returncode != 0:
            if "Invalid job id" in p.stderr:  # every job of the chunk has left the queue
                continue
            log.warning("[slurm] squeue failed (exit %d: %s): asking submitit (sacct) instead", p.returncode,
                        p.stderr.strip()[-300:])
            return None
        for line in p.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 3:
                out[parts[0]] = (parts[1], parts[2])
    return out


def ended_without_status(job_id: str, queued: Optional[tuple[str, str]]) -> tuple[str, str]:
    """(status, reason) of a run whose job ``job_id`` is over without a final status, from SLURM's last
    (state, reason) of it, if any: ``timeout`` for TIMEOUT / TimeLimit, ``oom`` for OUT_OF_MEMORY, else ``failed``."""
    state, reason = queued or (None, None)
    if never_starts(queued):
        return "failed", (f"SLURM cannot start job {job_id}: it was pending with reason {reason} "
                          f"({NEVER_STARTS[reason]}), so bench cancelled it; fewer ranks per job, or a partition that "
                          "holds it (hydra.launcher.*)")
    if not state:
        return "failed", f"submitit job {job_id} ended without a final status"
    msg = f"SLURM job {job_id} ended {state} (reason {reason}) without a final status from the run"
    if state == "TIMEOUT" or reason == "TimeLimit":
        return "timeout", msg + ": it reached its time limit (hydra.launcher.timeout_min)"
    return ("oom" if state == "OUT_OF_MEMORY" else "failed"), msg


class JobCollector:
    """Mixin over hydra-submitit-launcher's launchers: wait for the submitted jobs, one JobReturn each."""

    _EXECUTOR: str
    _QUEUE_POLL_S = 3.0

    def _queue_states(self, job_ids: list[str]) -> Optional[dict[str, tuple[str, str]]]:
        """{job id: (state, reason)} of the jobs the scheduler still lists, or None where it cannot say
        (not SLURM, or squeue failed): then submitit decides (job.done())."""
        return None

    def _collect(self, submitted: list) -> list[JobReturn]:
        """Wait until every job of ``submitted`` (num, overrides, sweep config, job) is over; their returns."""
        out: dict[int, JobReturn] = {}
        pending = list(submitted)
        total, n_done = len(submitted), 0
        seen: dict[str, tuple[str, str]] = {}  # the last state/reason the scheduler gave for each job
        next_poll, queue_ok = 0.0, False
        while pending:
            states = None
            if time.monotonic() >= next_poll:
                states = self._queue_states([str(item[3].job_id) for item in pending])
                next_poll = time.monotonic() + self._QUEUE_POLL_S
                queue_ok = states is not None
                seen.update(states or {})
            still = []
            for item in pending:
                num, overrides, sc, job = item
                jid = str(job.job_id)
                if not self._over(job, states, queue_ok):
                    still.append(item)
                    continue
                out[num] = self._finish(num, overrides, sc, job, seen.get(jid))
                n_done += 1
                if total > 1:
                    log.info("[%s] %d/%d jobs done: #%d %s", self._EXECUTOR, n_done, total, num,
                             out[num].return_value)
            pending = still
            if pending:
                time.sleep(1.0)
        return [out[num] for num, *_ in submitted]

    def _over(self, job, states: Optional[dict[str, tuple[str, str]]], queue_ok: bool) -> bool:
        """Whether ``job`` is over: the scheduler's word (gone from the queue, in a final state, or pending
        for a reason it will never start for: then cancelled here) or, without one, submitit's."""
        jid = str(job.job_id)
        if states is None:  # it answered at the last poll: wait for the next one; else (local tasks, or
            return False if queue_ok else job.done()  # squeue failed) submitit's result file or sacct
        if never_starts(states.get(jid)):
            log.error("[%s] job %s is pending for a reason SLURM will not get past (%s): cancelling it",
                      self._EXECUTOR, jid, states[jid][1])
            try:
                job.cancel(check=False)
            except Exception as e:
                log.warning("[%s] scancel %s failed: %s", self._EXECUTOR, jid, e)
            return True
        return jid not in states or states[jid][0] not in ACTIVE

    def _finish(self, num: int, overrides: list, sc: DictConfig, job,
                queued: Optional[tuple[str, str]] = None) -> JobReturn:
        """The JobReturn of a job that is over; its run gets a final status if it recorded none."""
        from bench.run.runs import STATUSES as FINAL
        from bench.run.runs import read_result

        d = job_dir(sc, num)
        r = read_result(d) if d.is_dir() else None
        status = r.status if r else None
        ret, error = None, None
        if status not in FINAL and not never_starts(queued):  # ask submitit why (a task raised, or the job died)
            ret, error = self._task_result(num, job)
            r = read_result(d) if d.is_dir() else None
            status = r.status if r else None
        if status not in FINAL:
            status = self._record_end(num, sc, job, d, r.info if r else {}, queued, error)
        if ret is None or not isinstance(ret, JobReturn):
            ret = JobReturn(overrides=overrides, working_dir=os.getcwd(), task_name="bench")
            ret.status = JobStatus.COMPLETED
        ret.return_value = status
        ret.status = JobStatus.COMPLETED  # bench recorded the outcome; the sweep goes on
        return ret

    def _task_result(self, num: int, job) -> tuple[Any, Optional[BaseException]]:
        """submitit's (return, error) of a job whose run recorded no final status: a task raised, or the
        job died (node failure, scancel, time limit).  Without a result pickle job.results() waits for
        sacct to call the job done, forever on a cluster without accounting: then NoResult."""
        ret, error = None, None
        if self._EXECUTOR == "slurm":  # a shared filesystem may show the task's result file late
            deadline = time.monotonic() + 5
            while not job.paths.result_pickle.exists() and time.monotonic() < deadline:
                time.sleep(0.5)
        if job.paths.result_pickle.exists() or self._EXECUTOR != "slurm":
            try:
                ret = job.results()[0]
            except Exception as e:
                error = e
        else:
            error = NoResult(job)
        if isinstance(ret, JobReturn) and ret.status == JobStatus.FAILED:  # the task function raised:
            error = ret._return_value  # hydra's launcher caught it into the JobReturn
            log.error("[%s] #%d: the job raised %s: %s", self._EXECUTOR, num, type(error).__name__, error,
                      exc_info=error if isinstance(error, BaseException) else None)
        return ret, error

    def _record_end(self, num: int, sc: DictConfig, job, d: Path, info: dict,
                    queued: Optional[tuple[str, str]], error: Optional[BaseException]) -> str:
        """Record a run its job left without a final status, from SLURM's last state: ``timeout`` for
        TIMEOUT / TimeLimit, ``oom`` for OUT_OF_MEMORY, else ``failed``; returns the status recorded."""
        from bench.run.runs import read_result

        status, msg = ended_without_status(str(job.job_id), queued)
        if error is not None:
            msg += f": {type(error).__name__}: {' '.join(str(error).split())[-2000:]}"
        mark_failed(d, sc, msg, info, status)
        r = read_result(d)
        log.error("[%s] #%d: %s", self._EXECUTOR, num, msg)
        return r.status if r else status

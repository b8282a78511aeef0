"""Runs through submitit: SLURM (``hydra/launcher=slurm``) and local tasks (``hydra/launcher=local_tasks``).

Launcher side.  hydra-submitit-launcher 1.2 builds ONE executor per sweep from
``hydra.launcher.*`` (resolved once, when the launcher is instantiated from the primary config,
before any job's overrides exist) and submits every job of the sweep as one job array with those
parameters: nodes, tasks and GPUs are the same for all jobs, so a sweep over ``world_size=1,2,4``
cannot get one task per GPU per job, and ``${world_size}`` in the launcher config would resolve to
the default world size.  :class:`BenchSlurmLauncher` / :class:`BenchLocalLauncher` subclass its
launchers and override ``launch``: for every job they compose the job's own config and set the
executor parameters before submitting it:

* ``tasks_per_node`` = min(world_size, ``gpus_per_node``) (the largest divisor of world_size not
  above it), ``nodes`` = world_size / tasks_per_node, ``gpus_per_node`` = tasks_per_node (one task
  and one GPU per rank; none for device=cpu).  ``gpus_per_node`` in the launcher config is the
  number of GPUs of one cluster node; the local launcher runs every task on this machine;
* ``timeout_min`` is raised to run_timeout_s + 5 min where needed, so bench's own timeout
  fires first and records status ``timeout``;
* partition / account / qos / constraint / setup / srun_args / additional_parameters and the rest
  are passed through (``hydra.launcher.partition=gpu hydra.launcher.account=abc``);
* each job is submitted on its own (no array): SLURM runs them in parallel; bench's sweeper
  launches local jobs one at a time (submitit_local would run a whole sweep at once);
* a job sbatch refuses (GPUs, a partition or an account the cluster does not have) is recorded
  ``failed`` with sbatch's error, and the sweep goes on (it used to end with a traceback, its runs
  left ``pending``);
* when a job is over is SLURM's word: ``squeue -t all`` every few seconds (a job in a final state, or
  no longer listed).  submitit asks ``sacct``, which needs SLURM's accounting database: without
  one, a job that ended without submitit's result file (SLURM's time limit, scancel, node failure,
  bench's own watchdog, which ends the processes with os._exit) was never seen to end and the sweep
  waited forever; with one, only after submitit's polling delay (up to 10 minutes);
* a job that ended without a final status (killed before rank 0 could record one) is marked by the
  launcher (the controller) from SLURM's last state: ``timeout`` when SLURM says TIMEOUT / TimeLimit,
  ``oom`` for OUT_OF_MEMORY, else ``failed``, with SLURM's state and reason and submitit's error.

Task side (bench/job.py ``run_task``, bench/launch/task.py ``launch_task_rank``).  Under submitit there is
no torchrun: the task function runs in every task; when the job
has world_size tasks, this process IS a rank: it exports the torch.distributed environment from
submitit (``TorchDistributedEnvironment().export()``: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; a world_size=1 run in its one task too), validates and calls ``bench.worker.worker_main``
directly.  Rank 0 writes
status.json and metrics.json, the other ranks only their rank files.  A watchdog thread in every
rank ends the run on ``run_timeout_s`` or when another rank has failed (its failure_rank*.json
appears in the shared run folder), so one failing rank cannot leave the others waiting in a
collective; rank 0 records the root cause first.  The same watchdog acts on SLURM's SIGTERM (seen
through a wakeup pipe, so also while the main thread is blocked in a collective): rank 0 asks squeue
why - reason ``TimeLimit``: status ``timeout``; else (scancel, preemption) ``failed``, reason
"cancelled" - records it within KillWait, and every rank exits.  submitit's own handlers would ignore
SIGTERM (nothing recorded before SLURM's SIGKILL) and, on the time-limit warning (USR2,
signal_delay_s before the limit, up to a minute early), requeue the job or raise "timed-out too many
times" inside the run: bench only logs the warning (a benchmark run is not resumable).  A requeued
job (``scontrol requeue``, preemption) runs again into the same folder; the launcher waits for it.
Ctrl-C in the sweep process: the launcher records its unfinished runs ``interrupted`` before it
cancels their jobs, and the ranks keep that status (resume=true runs them again).  A job given one task (e.g.
``hydra/launcher=submitit_slurm`` with its defaults) runs the local elastic launch inside the
allocation instead (all ranks on that node).
"""
from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
from omegaconf import DictConfig, OmegaConf, open_dict

from bench.jsonio import write_json_atomic

log = logging.getLogger("bench.slurm")

_GENERIC = set(OmegaConf.structured(BaseQueueConf).keys())  # submitit's shared parameter names


def split_ranks(world_size: int, gpus_per_node: Optional[int]) -> tuple[int, int]:
    """(nodes, tasks_per_node) for world_size ranks on nodes of gpus_per_node GPUs."""
    cap = gpus_per_node or world_size
    tpn = max(1, min(world_size, cap))
    while world_size % tpn:
        tpn -= 1
    return world_size // tpn, tpn


class _PerJobResources:
    """Mixin over hydra-submitit-launcher's launchers: executor parameters per job."""

    _EXECUTOR: str
    parallel_jobs = False  # the bench sweeper launches jobs one at a time unless True
    job_nums: Optional[list[int]] = None  # set by the bench sweeper: the jobs' numbers
    _OWN = {"submitit_folder", "max_num_timeout", "gpus_per_node", "tasks_per_node", "nodes"}

    params: dict
    config: Optional[DictConfig]
    hydra_context: Any

    # -- resources
    def _uses_gpu(self, cfg: DictConfig) -> bool:
        return str(cfg.device) != "cpu"

    def job_resources(self, cfg: DictConfig) -> dict:
        ws = int(cfg.world_size)
        nodes, tpn = split_ranks(ws, self._node_gpus())
        res: dict[str, Any] = {"nodes": nodes, "tasks_per_node": tpn}
        gpus = tpn if self._uses_gpu(cfg) else None
        gres = self.params.get("gres")
        if gres and "{gpus}" in str(gres):  # e.g. gres: "gpu:{gpus}" on clusters that want --gres
            res["gres"] = str(gres).format(gpus=gpus or 0)
        elif not gres:
            res["gpus_per_node"] = gpus
        timeout = self.params.get("timeout_min")
        if cfg.get("run_timeout_s"):
            need = math.ceil(cfg.run_timeout_s / 60) + 5
            timeout = max(timeout or 0, need)
        if timeout:
            res["timeout_min"] = int(timeout)
        return res

    def _node_gpus(self) -> Optional[int]:
        return self.params.get("gpus_per_node")

    def precheck_gpus(self, cfg: dict) -> int:
        """GPUs the sweeper's pre-check assumes a job gets (its allocation)."""
        return int(cfg["world_size"]) if cfg.get("device") != "cpu" else 0

    def _base_params(self) -> dict:
        out = {}
        for k, v in self.params.items():
            if k in self._OWN or v is None:
                continue
            out[k if k in _GENERIC else f"{self._EXECUTOR}_{k}"] = v
        return out

    def _prefixed(self, res: dict) -> dict:
        return {k if k in _GENERIC else f"{self._EXECUTOR}_{k}": v for k, v in res.items()}

    def _job_dir(self, sc: DictConfig, num: int) -> Path:
        with open_dict(sc):
            sc.hydra.job.num = num
        return Path(str(sc.hydra.sweep.dir)) / str(OmegaConf.select(sc, "hydra.sweep.subdir"))

    # -- launch
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None and self.hydra_context is not None
        nums = list(self.job_nums) if self.job_nums and len(self.job_nums) == len(job_overrides) \
            else list(range(initial_job_idx, initial_job_idx + len(job_overrides)))
        self.job_nums = None
        init = {"folder": self.params["submitit_folder"]}
        if self.params.get("max_num_timeout") is not None and self._EXECUTOR == "slurm":
            init["slurm_max_num_timeout"] = self.params["max_num_timeout"]
        base = self._base_params()
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        # the tasks unpickle this launcher (hydra_plugins.bench_plugins) and bench: make the repository
        # importable there whatever their working directory (local tasks and sbatch inherit the env)
        root = str(Path(__file__).resolve().parents[1])
        pp = os.environ.get("PYTHONPATH", "")
        if root not in pp.split(os.pathsep):
            os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (root, pp) if x)
        submitted = []
        refused: dict[int, JobReturn] = {}
        try:
            for num, overrides in zip(nums, job_overrides):
                sc = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                res = self.job_resources(sc)
                # a fresh executor per job: update_parameters merges, and None means "keep"
                executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
                executor.update_parameters(**{**base, **self._prefixed(res)})
                try:
                    job = executor.submit(self, list(overrides), "hydra.sweep.dir", num, f"job_id_for_{num}",
                                          Singleton.get_state())
                except Exception as e:  # sbatch refused it (GPUs, partition, account the cluster lacks):
                    refused[num] = self._refused(num, list(overrides), sc, e)  # this run fails, the sweep goes on
                    continue
                log.info("[%s] #%d submitted as %s: %s (%s)", self._EXECUTOR, num, job.job_id,
                         " ".join(filter_overrides(overrides)), ", ".join(f"{k}={v}" for k, v in res.items() if v is not None))
                submitted.append((num, list(overrides), sc, job))
            done = dict(zip([item[0] for item in submitted], self._collect(submitted)))
            return [refused[num] if num in refused else done[num] for num in nums]
        except KeyboardInterrupt:
            from bench.runs import read_result

            for num, _, sc, job in submitted:
                if not job.done():
                    # recorded before the cancel: the job's ranks, ended by SLURM's SIGTERM, keep it
                    # (a cancelled run is otherwise "failed"), so resume=true runs it again
                    try:
                        d = self._job_dir(sc, num)
                        r = read_result(d) if d.is_dir() else None
                        mark_failed(d, sc, "Ctrl-C in the sweep process: job cancelled", r.info if r else {},
                                    "interrupted")
                    except Exception:
                        log.exception("[%s] #%d: recording the interruption failed", self._EXECUTOR, num)
                    try:
                        job.cancel(check=False)
                    except Exception:
                        pass
            raise

    def _refused(self, num: int, overrides: list, sc: DictConfig, e: Exception) -> JobReturn:
        from bench.runs import read_result

        d = self._job_dir(sc, num)
        r = read_result(d) if d.is_dir() else None
        msg = f"the job could not be submitted: {type(e).__name__}: {' '.join(str(e).split())[-2000:]}"
        mark_failed(d, sc, msg, r.info if r else {})
        log.error("[%s] #%d: %s", self._EXECUTOR, num, msg)
        ret = JobReturn(overrides=overrides, working_dir=os.getcwd(), task_name="bench")
        ret.return_value = "failed"
        ret.status = JobStatus.COMPLETED  # recorded; the sweep goes on
        return ret

    # -- when is a job over, and how did it end
    _QUEUE_POLL_S = 3.0

    def _queue_states(self, job_ids: list[str]) -> Optional[dict[str, tuple[str, str]]]:
        """{job id: (state, reason)} of the jobs the scheduler still lists, or None where it cannot say
        (not SLURM, or squeue failed): then submitit decides (job.done())."""
        return None

    def _collect(self, submitted: list) -> list[JobReturn]:
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
                if states is not None:  # the scheduler's word: gone from the queue, or in a final state
                    done = jid not in states or states[jid][0] not in _ACTIVE
                elif queue_ok:  # it answered at the last poll: wait for the next one
                    done = False
                else:  # no scheduler to ask (local tasks, or squeue failed): submitit's result file or sacct
                    done = job.done()
                if not done:
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

    def _finish(self, num: int, overrides: list, sc: DictConfig, job,
                queued: Optional[tuple[str, str]] = None) -> JobReturn:
        from bench.runs import STATUSES as FINAL
        from bench.runs import read_result

        d = self._job_dir(sc, num)
        r = read_result(d) if d.is_dir() else None
        status = r.status if r else None
        ret, error = None, None
        if status not in FINAL:  # ask submitit why (a task raised, or the job died: node failure,
            # scancel, time limit); bench's own outcome needs no result pickle.  Without a result pickle
            # job.results() waits for sacct to call the job done, forever on a cluster without accounting
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
                error = _NoResult(job)
            if isinstance(ret, JobReturn) and ret.status == JobStatus.FAILED:  # the task function raised:
                error = ret._return_value  # hydra's launcher caught it into the JobReturn
                log.error("[%s] #%d: the job raised %s: %s", self._EXECUTOR, num, type(error).__name__, error,
                          exc_info=error if isinstance(error, BaseException) else None)
            r = read_result(d) if d.is_dir() else None
            status = r.status if r else None
        if status not in FINAL:
            state, reason = queued or (None, None)
            msg = f"submitit job {job.job_id} ended without a final status"
            status = "failed"
            if state:
                msg = f"SLURM job {job.job_id} ended {state} (reason {reason}) without a final status from the run"
                if state == "TIMEOUT" or reason == "TimeLimit":
                    status, msg = "timeout", msg + ": it reached its time limit (hydra.launcher.timeout_min)"
                elif state == "OUT_OF_MEMORY":
                    status = "oom"
            if error is not None:
                msg += f": {type(error).__name__}: {' '.join(str(error).split())[-2000:]}"
            mark_failed(d, sc, msg, r.info if r else {}, status)
            r = read_result(d)
            status = r.status if r else status
            log.error("[%s] #%d: %s", self._EXECUTOR, num, msg)
        if ret is None or not isinstance(ret, JobReturn):
            ret = JobReturn(overrides=overrides, working_dir=os.getcwd(), task_name="bench")
            ret.status = JobStatus.COMPLETED
        ret.return_value = status
        ret.status = JobStatus.COMPLETED  # bench recorded the outcome; the sweep goes on
        return ret


# SLURM job states of a job that is not over yet (squeue %T); any other state, or a job squeue no longer
# lists (MinJobAge after its end), is over
_ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
           "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}


class _NoResult(Exception):
    def __init__(self, job) -> None:
        tail = ""
        try:
            err = Path(job.paths.stderr).read_text(errors="replace").strip().splitlines()[-15:]
            tail = " | ".join(line for line in err if line.strip())
        except OSError:
            pass
        super().__init__(f"the job was ended before the task could report (no {Path(job.paths.result_pickle).name})"
                         + (f"; its stderr ends: {tail}" if tail else ""))


def mark_failed(d: Path, sc: DictConfig, message: str, info: dict, status: str = "failed") -> None:
    from bench.runs import mark_unfinished, read_failures

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


class BenchSlurmLauncher(_PerJobResources, SlurmLauncher):
    """hydra/launcher=slurm: one SLURM job per run, sized by its world_size; jobs run in parallel."""

    parallel_jobs = True

    def _queue_states(self, job_ids: list[str]) -> Optional[dict[str, tuple[str, str]]]:
        """squeue's state and reason of each job it still lists (``-t all``: ended ones too, for
        MinJobAge).  submitit asks sacct, which needs SLURM's accounting database: without one (small
        clusters, tests/slurm_cluster.py) a job killed before it wrote its result (time limit, scancel,
        node failure) would never be seen to end, and the sweep would wait forever."""
        import subprocess

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


class BenchLocalLauncher(_PerJobResources, LocalLauncher):
    """hydra/launcher=local_tasks: submitit's local executor, one task per rank on this machine."""

    def _node_gpus(self) -> Optional[int]:
        return None  # every task on this machine

    def _uses_gpu(self, cfg: DictConfig) -> bool:
        from bench.config import cuda_device_count

        return str(cfg.device) == "cuda" or (str(cfg.device) == "auto" and cuda_device_count() > 0)

    def precheck_gpus(self, cfg: dict) -> int:
        from bench.config import cuda_device_count

        return cuda_device_count()

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
* a job that ended without a final status (node failure, scancel, SLURM time limit) is marked
  ``failed`` with submitit's error by the launcher (the controller).

Task side.  Under submitit there is no torchrun: :func:`run_task` runs in every task; when the job
has world_size tasks, this process IS a rank: it exports the torch.distributed environment from
submitit (``TorchDistributedEnvironment().export()``: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), validates and calls ``bench.worker.worker_main`` directly.  Rank 0 writes
status.json and metrics.json, the other ranks only their rank files.  A watchdog thread in every
rank ends the run on ``run_timeout_s`` or when another rank has failed (its failure_rank*.json
appears in the shared run folder), so one failing rank cannot leave the others waiting in a
collective; rank 0 records the root cause first.  A job given one task (e.g.
``hydra/launcher=submitit_slurm`` with its defaults) runs the local elastic launch inside the
allocation instead (all ranks on that node).
"""
from __future__ import annotations

import logging
import math
import os
import threading
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


def in_submitit_task() -> bool:
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


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
        try:
            for num, overrides in zip(nums, job_overrides):
                sc = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                res = self.job_resources(sc)
                # a fresh executor per job: update_parameters merges, and None means "keep"
                executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
                executor.update_parameters(**{**base, **self._prefixed(res)})
                job = executor.submit(self, list(overrides), "hydra.sweep.dir", num, f"job_id_for_{num}",
                                      Singleton.get_state())
                log.info("[%s] #%d submitted as %s: %s (%s)", self._EXECUTOR, num, job.job_id,
                         " ".join(filter_overrides(overrides)), ", ".join(f"{k}={v}" for k, v in res.items() if v is not None))
                submitted.append((num, list(overrides), sc, job))
            return self._collect(submitted)
        except KeyboardInterrupt:
            for num, _, sc, job in submitted:
                if not job.done():
                    try:
                        job.cancel(check=False)
                    except Exception:
                        pass
            raise

    def _collect(self, submitted: list) -> list[JobReturn]:
        out: dict[int, JobReturn] = {}
        pending = list(submitted)
        total, n_done = len(submitted), 0
        while pending:
            still = []
            for item in pending:
                num, overrides, sc, job = item
                if not job.done():
                    still.append(item)
                    continue
                out[num] = self._finish(num, overrides, sc, job)
                n_done += 1
                if total > 1:
                    log.info("[%s] %d/%d jobs done: #%d %s", self._EXECUTOR, n_done, total, num,
                             out[num].return_value)
            pending = still
            if pending:
                time.sleep(1.0)
        return [out[num] for num, *_ in submitted]

    def _finish(self, num: int, overrides: list, sc: DictConfig, job) -> JobReturn:
        from bench.runs import STATUSES as FINAL
        from bench.runs import read_result

        d = self._job_dir(sc, num)
        r = read_result(d) if d.is_dir() else None
        status = r.status if r else None
        ret, error = None, None
        if status not in FINAL:  # ask submitit why (a task raised, or the job died: node failure,
            try:                 # scancel, time limit); bench's own outcome needs no result pickle
                ret = job.results()[0]
            except Exception as e:
                error = e
            r = read_result(d) if d.is_dir() else None
            status = r.status if r else None
        if status not in FINAL:
            msg = f"submitit job {job.job_id} ended without a final status"
            if error is not None:
                msg += f": {type(error).__name__}: {' '.join(str(error).split())[-2000:]}"
            mark_failed(d, sc, msg, r.info if r else {})
            status = "failed"
            log.error("[%s] #%d: %s", self._EXECUTOR, num, msg)
        if ret is None or not isinstance(ret, JobReturn):
            ret = JobReturn(overrides=overrides, working_dir=os.getcwd(), task_name="bench")
            ret.status = JobStatus.COMPLETED
        ret.return_value = status
        ret.status = JobStatus.COMPLETED  # bench recorded the outcome; the sweep goes on
        return ret


def mark_failed(d: Path, sc: DictConfig, message: str, info: dict) -> None:
    from bench.job import mark_unfinished
    from bench.launch import read_failures

    d.mkdir(parents=True, exist_ok=True)
    try:
        task = OmegaConf.to_container(sc, resolve=True)
        task.pop("hydra", None)
    except Exception:
        task = {}
    if info and not (d / "status.json").exists():
        write_json_atomic(d / "status.json", info)
    mark_unfinished(d, task, "failed", "JobFailure", message, read_failures(d))


class BenchSlurmLauncher(_PerJobResources, SlurmLauncher):
    """hydra/launcher=slurm: one SLURM job per run, sized by its world_size; jobs run in parallel."""

    parallel_jobs = True


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


# ---------------------------------------------------------------------------------- task side
class _Watchdog(threading.Thread):
    """Ends this rank on run_timeout_s or when another rank has failed; rank 0 records it first."""

    def __init__(self, run_dir: Path, rank: int, timeout_s: Optional[float], finalize) -> None:
        super().__init__(daemon=True, name="bench-watchdog")
        self.run_dir, self.rank, self.timeout_s, self.finalize = run_dir, rank, timeout_s, finalize
        self.t0 = time.time()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            if self.timeout_s and time.time() - self.t0 > self.timeout_s:
                self._fire("timeout")
            peers = [p for p in self.run_dir.glob("failure_rank*.json") if p.name != f"failure_rank{self.rank}.json"]
            if peers:
                time.sleep(1.0)  # let the failing rank's peers write theirs: the earliest is the root cause
                if not self.stopped.is_set():
                    self._fire("peer")

    def _fire(self, why: str) -> None:
        log.error("rank %d: %s: ending this rank", self.rank,
                  f"run exceeded run_timeout_s={self.timeout_s}" if why == "timeout" else "another rank failed")
        if self.rank == 0:
            try:
                self.finalize(why)
            except BaseException:
                log.exception("recording the outcome failed")
        else:
            time.sleep(2.0)  # give rank 0 the time to record the outcome
        logging.shutdown()
        os._exit(1)


def _since_process_start(t: float) -> Optional[float]:
    """Seconds from this process's start (Linux /proc) to t: submitit's own start-up (unpickling, imports)."""
    try:
        btime = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        return t - (btime + ticks / os.sysconf("SC_CLK_TCK"))
    except Exception:
        return None


def run_task(cfg: DictConfig, run_dir: Path, command: list[str], t0: float, explicit=()) -> str:
    """The task function body in a submitit task (see the module docstring)."""
    import submitit

    from bench.config import cuda_device_count
    from bench.job import finish, plan_run, record_invalid, run
    from bench.launch import read_failures
    from bench.runs import holds_completed, write_status
    from bench.schema import ConfigError

    env = submitit.JobEnvironment()
    rank, ntasks = env.global_rank, env.num_tasks
    if ntasks == 1 and int(cfg.world_size) > 1:  # one task for all ranks: torch elastic inside the allocation
        return run(cfg, run_dir, command, t0, explicit)
    if holds_completed(run_dir):  # every rank reads the same (metrics.json is written last)
        log.error("%s already holds a completed result: not running into it", run_dir)
        return "refused"
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    raw, base, plan, err = plan_run(cfg, run_dir, explicit, gpus=cuda_device_count() * env.num_nodes)
    base["submitit_job_id"] = env.job_id
    base["process_start_s"] = _since_process_start(t0)  # task process start -> task function (not in startup_s)
    if rank == 0:
        write_status(run_dir, "running", **base)
    if ntasks != int(cfg.world_size):
        e = ConfigError("world_size", cfg.world_size, f"the job has {ntasks} tasks (one per rank is needed); "
                        "use hydra/launcher=slurm, which sizes each job by its world_size")
        return record_invalid(run_dir, raw, base, e, t0) if rank == 0 else "invalid"
    if err is not None:
        return record_invalid(run_dir, raw, base, err, t0) if rank == 0 else "invalid"
    plan.cfg["_command"] = command
    if rank == 0:
        log.info("run %s: %s, rank %d of %d (%d node(s)), master %s:%s", run_dir, env, rank, ntasks,
                 env.num_nodes, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])

    lock = threading.Lock()
    recorded: list[str] = []

    def finalize(why: str, exc: Optional[BaseException] = None) -> str:
        with lock:
            if recorded:
                return recorded[0]
            failures = read_failures(run_dir)
            if why == "completed":
                status, error = "completed", None
            elif why == "timeout":
                status, error = "timeout", {"rank": None, "type": "Timeout", "traceback": None,
                                            "message": f"run exceeded run_timeout_s={cfg.run_timeout_s}; "
                                                       "all its ranks were ended"}
            elif failures:
                root = failures[0]
                interrupted = root.get("type") == "KeyboardInterrupt"
                status = "interrupted" if interrupted else ("oom" if root.get("oom") else "failed")
                error = {k: root.get(k) for k in ("rank", "type", "message", "traceback")}
            else:
                status, error = "failed", {"rank": rank, "type": type(exc).__name__ if exc else "Unknown",
                                           "message": str(exc), "traceback": None}
            recorded.append(finish(run_dir, raw, status, error, failures, base, t0))
            return recorded[0]

    from bench.worker import worker_main

    dog = _Watchdog(run_dir, rank, cfg.get("run_timeout_s"), finalize)
    dog.start()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)  # worker_main reconfigures logging for its rank files
    exc: Optional[BaseException] = None
    try:
        worker_main(plan.to_dict(), str(run_dir))
    except BaseException as e:  # KeyboardInterrupt included: recorded as interrupted
        exc = e
    finally:
        dog.stopped.set()
        for h in root.handlers[:]:
            root.removeHandler(h)
            h.close()
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
    if rank != 0:
        return "completed" if exc is None else "failed"
    if exc is not None:
        time.sleep(1.0)  # the peers' failure files: the earliest is the root cause
    return finalize("completed" if exc is None else "failed", exc)

"""The sweeper (``hydra/sweeper=bench``): plan every job, record what will not run, run the rest
(bench/sweep/__init__.py says what the plan decides)."""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from bench.jsonio import read_json_dict, write_json_atomic
from bench.metrics import STATUSES, skeleton
from bench.runs import ATTEMPTS, FAILED, mark_unfinished, move_aside, read_result, scan
from bench.sweep import claims
from bench.sweep.cost import fmt_s
from bench.sweep.jobs import Job, compose, declare_preloads, expand, log_plan
from bench.sweep.summary import MANIFEST, progress

log = logging.getLogger("bench.sweep")


class BenchSweeper(Sweeper):
    """Hydra's sweep syntax with the plan described in the module docstring (Hydra's public
    Sweeper interface; the launcher is Hydra's, instantiated as Hydra's basic sweeper does)."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict] = None,
                 dry_run: bool = False, sequential: Optional[bool] = None,
                 history: Optional[list] = None) -> None:
        self.max_batch_size = max_batch_size  # accepted for Hydra's basic-sweeper config; runs go one at a time
        self.params = dict(params or {})
        self.dry_run = dry_run
        self.sequential = sequential  # None: one at a time unless the launcher runs jobs in parallel
        self.history = list(history or [])
        self.hydra_context = self.config = self.launcher = None
        self._gpus: Optional[int] = None

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)
        self._busy: set[str] = set()  # run folders claimed by other live sweep processes (bench/sweep/claims.py)
        self._jobs: list = []

    # -- planning
    def _expand(self, arguments: list[str]) -> list[list[str]]:
        params = [f"{k}={v}" for k, v in self.params.items()]
        return expand(OverridesParser.create(config_loader=self.hydra_context.config_loader), params + list(arguments))

    def _compose(self, job: Job) -> None:
        compose(job, lambda overrides: self.hydra_context.config_loader.load_sweep_config(self.config, overrides),
                self._gpus_for, self._gpu_memory_gib)

    def _gpus_for(self, cfg: dict) -> int:
        fn = getattr(self.launcher, "precheck_gpus", None)
        if fn is not None:
            return fn(cfg)
        if self._gpus is None:
            from bench.config import cuda_device_count

            self._gpus = cuda_device_count()
        return self._gpus

    def _gpu_memory_gib(self, cfg: dict) -> Optional[float]:
        fn = getattr(self.launcher, "gpu_memory_gib", None)
        return fn(cfg) if fn is not None else None

    def _decide(self, job: Job, results: list, taken: set[str], resume: bool, rerun: bool) -> None:
        same = [r for r in results if r.key == job.key]
        if resume:
            done = [r for r in same if r.status == "completed"]
            # stopped by Ctrl-C: no result of its configuration, so resume=true runs it again
            stopped = [r for r in same if r.status == "interrupted"]
            failed = [r for r in same if r.status in FAILED and r.status != "interrupted"]
            unrun = [r for r in same if r.status in ("invalid", "skipped")]
            if done:
                job.action, job.dir, job.reason = "skip", done[0].dir.name, f"completed earlier in {done[0].dir.name}/"
                return
            if failed and not rerun:
                job.action, job.dir = "skip", failed[0].dir.name
                job.reason = f"{failed[0].status} earlier in {failed[0].dir.name}/ (rerun_failed=true runs it again)"
                return
            if unrun and job.action in ("invalid", "skipped"):
                job.action, job.dir, job.reason = "skip", unrun[0].dir.name, f"still {job.action}: {job.reason}"
                return
            if failed or stopped:  # rerun_failed / interrupted: run it again in the folder of its attempt
                again = failed + stopped
                job.reason = f"{again[0].status} earlier in {again[0].dir.name}/: running it again"
                job.dir = self._folder(job, taken, prefer=[r.dir.name for r in again])
                return
        job.dir = self._folder(job, taken)

    def _folder(self, job: Job, taken: set[str], prefer: Sequence[str] = ()) -> str:
        base = str(job.num)
        names = [*prefer, base, f"{base}_{job.key[:8]}"] + [f"{base}_{job.key[:8]}_{i}" for i in range(2, 10_000)]
        for name in names:
            if self._free(name, job, taken):
                return name
        raise RuntimeError(f"no free folder for job {job.num} in {self.sweep_dir}")

    def _choose_again(self, j: Job, jobs: Sequence[Job]) -> None:
        """Another sweep process took the folder planned for j: the first free one not planned for jobs."""
        j.dir = self._folder(j, {x.dir for x in jobs if x is not j and x.action != "skip" and x.dir})

    def _free(self, name: str, job: Job, taken: set[str]) -> bool:
        """Not planned for another job nor claimed by another live process (_busy); empty, a stale attempt,
        or this configuration's own failed / invalid one."""
        if name in taken or name in self._busy:
            return False
        d = self.sweep_dir / name
        r = read_result(d) if d.is_dir() else None
        return r is None or r.status not in STATUSES or (r.status != "completed" and r.key == job.key)

    def _prepare(self, job: Job) -> None:
        """Write what a planned job's folder shows before it runs."""
        d = self.sweep_dir / job.dir
        old = read_result(d) if d.is_dir() else None
        rerecord = job.action in ("invalid", "skipped") and old is not None and old.status == job.action
        # a pending status and nothing else (planned by a sweep, never started) is no attempt to keep
        rerecord |= old is not None and old.status == "pending" and \
            [p.name for p in d.iterdir() if p.name != ATTEMPTS] == ["status.json"]
        if d.is_dir() and not rerecord and any(p.name != ATTEMPTS for p in d.iterdir()):
            dest = move_aside(d)
            log.info("[sweep] job #%d: earlier attempt in %s/ moved to %s", job.num, job.dir,
                     dest.relative_to(self.sweep_dir))
        d.mkdir(parents=True, exist_ok=True)
        base = {"key": job.key, **job.ident, "overrides": job.record()["overrides"], "time": time.time(),
                "sweep": claims.owner()}  # the sweep process that planned it (bench/sweep/claims.py)
        if job.action in ("invalid", "skipped"):
            m = skeleton(job.cfg or {}, job.action, job.error)
            if job.memory is not None:
                m["memory"]["plan"] = job.memory
            m["job"] = {"key": job.key, "wall_s": 0.0, "startup_s": None, "teardown_s": None, "overhead_s": None,
                        "recorded_by": "sweep pre-check (no process started)"}
            write_json_atomic(d / "metrics.json", m)
            write_json_atomic(d / "status.json", {"status": job.action, **base, "reason": job.reason, "wall_s": 0.0})
        else:
            write_json_atomic(d / "status.json", {"status": "pending", **base})

    def plan(self, overrides: list[list[str]], first_num: int = 0) -> list[Job]:
        """Jobs for override lists (numbered from first_num), composed, validated, keyed and given a folder
        (nothing written)."""
        jobs = [Job(num=first_num + i, overrides=list(o)) for i, o in enumerate(overrides)]
        # run folders claimed by other live sweep processes are never chosen (bench/sweep/claims.py)
        self._busy = {name for name, c in claims.live_claims(self.sweep_dir, prune=False).items()
                      if not claims.is_me(c.get("owner"))}
        results = scan(self.sweep_dir)
        taken: set[str] = set(getattr(self, "_taken", set()))
        for job in jobs:
            self._compose(job)
            self._decide(job, results, taken, self.resume, self.rerun)
            if job.action != "skip":
                taken.add(job.dir)
        self._taken = taken
        return jobs

    # -- the sweep
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        self._begin()
        t_plan = time.time()
        jobs = self.plan(self._expand(arguments))
        return self.execute(jobs, time.time() - t_plan)

    def _begin(self) -> None:
        self.sweep_dir = Path(str(self.config.hydra.sweep.dir))
        self.resume = bool(OmegaConf.select(self.config, "resume", default=False))
        self.rerun = bool(OmegaConf.select(self.config, "rerun_failed", default=False))
        self.dry = self.dry_run or bool(OmegaConf.select(self.config, "dry_run", default=False))
        self.manifest = {"started": time.time(), "sweep_dir": str(self.sweep_dir), "argv": sys.argv,
                         "resume": self.resume, "rerun_failed": self.rerun, "launcher": type(self.launcher).__name__,
                         "interrupted": False, "jobs": []}
        self._t_plan = time.time()
        self._jobs: list[Job] = []

    def execute(self, jobs: list[Job], plan_s: float = 0.0) -> list:
        """Log the plan, record what will not run, then run the rest (one at a time, or all at once)."""
        to_run = [j for j in jobs if j.action == "run"]
        cwd = Path(str(OmegaConf.select(self.config, "hydra.runtime.cwd", default=os.getcwd())))
        log_plan(jobs, to_run, self.sweep_dir, [self.sweep_dir, cwd / "multirun", *map(Path, map(str, self.history))],
                 self.resume, self.rerun, plan_s, self.dry)
        if self.dry:
            log.info("[sweep] dry run: nothing written, nothing run")
            return []
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        # written holding the sweep folder's lock: another sweep process on this folder (bench/sweep/claims.py)
        # sees either none or all of these folders; each job is claimed again just before it runs
        with claims.locked(self.sweep_dir):
            OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
            # the folders were chosen while planning, without the lock: another sweep process may have
            # claimed one (and started writing into it) or completed a run in it since: choose again
            self._busy = {name for name, c in claims.live_claims(self.sweep_dir).items()
                          if not claims.is_me(c.get("owner"))}
            for j in jobs:
                if j.action != "skip":
                    if not self._free(j.dir, j, set()):
                        self._choose_again(j, self._jobs + jobs)
                    self._prepare(j)
            self._jobs += jobs
            self.manifest["jobs"] = [j.record() for j in self._jobs]
            write_json_atomic(self.sweep_dir / MANIFEST, self.manifest)
        for j in to_run:
            j.overrides = list(j.overrides) + [f"hydra.sweep.subdir={j.dir}"]
        declare_preloads(to_run)
        sequential = self.sequential
        if sequential is None:
            sequential = not getattr(self.launcher, "parallel_jobs", False)
        if not to_run:
            return []
        return self._run_sequential(to_run) if sequential else self._run_parallel(to_run)

    def over_budget(self) -> Optional[str]:
        """Why no further run should start (None: go on); the knob search stops at its GPU-time budget."""
        return None

    def _stopped(self) -> None:
        self.manifest["interrupted"] = True
        write_json_atomic(self.sweep_dir / MANIFEST, self.manifest)

    # -- claims: several sweep processes on one sweep folder (bench/sweep/claims.py)
    def _claim(self, j: Job) -> str:
        """Claim job j just before it runs: "run" (claimed, into j.dir), "done" (with resume=true:
        another sweep completed it, or ran it since this one planned: it is not run twice) or "busy"
        (with resume=true: another live sweep process runs it now; wait for it)."""
        with claims.locked(self.sweep_dir):
            others = {name: c for name, c in claims.live_claims(self.sweep_dir).items()
                      if not claims.is_me(c.get("owner"))}
            self._busy = set(others)
            if self.resume:
                held = [name for name, c in others.items() if c.get("key") == j.key]
                if held:
                    j.reason = f"being run by another sweep (pid {others[held[0]]['owner'].get('pid')}) in {held[0]}/"
                    return "busy"
                same = [r for r in scan(self.sweep_dir) if r.key == j.key]
                done = [r for r in same if r.status == "completed"] or \
                    [r for r in same if r.status in STATUSES and (r.info.get("time") or 0) > self._t_plan]
                if done:
                    self._leave(j.dir)
                    j.action, j.dir = "skip", done[0].dir.name
                    j.reason = f"{done[0].status} by another sweep in {done[0].dir.name}/"
                    self._rewrite_manifest()
                    return "done"
            st = read_json_dict(self.sweep_dir / j.dir / "status.json") or {}
            if j.dir in others or not (st.get("status") == "pending" and claims.is_me(st.get("sweep"))):
                # another sweep process took the folder planned for it: choose again
                old = j.dir
                self._choose_again(j, self._jobs)
                self._prepare(j)
                j.overrides = [o for o in j.overrides if not o.startswith("hydra.sweep.subdir=")] + \
                    [f"hydra.sweep.subdir={j.dir}"]
                log.info("[sweep] job #%d: %s/ was taken by another sweep process: runs into %s/", j.num, old, j.dir)
                self._rewrite_manifest()
            claims.claim(self.sweep_dir, j.dir, j.key)
            return "run"

    def _leave(self, name: Optional[str]) -> None:
        """Remove the pending status this process planned into a folder it will not run into."""
        if not name:
            return
        d = self.sweep_dir / name
        st = read_json_dict(d / "status.json") or {}
        if st.get("status") == "pending" and claims.is_me(st.get("sweep")):
            (d / "status.json").unlink(missing_ok=True)
            try:
                d.rmdir()
            except OSError:
                pass

    def _rewrite_manifest(self) -> None:
        self.manifest["jobs"] = [x.record() for x in self._jobs]
        write_json_atomic(self.sweep_dir / MANIFEST, self.manifest)

    def _next(self, queue: list[Job], waiting: set[int]) -> Optional[Job]:
        """The first job of the queue this process claims (None: every one left is run by another sweep)."""
        for cand in list(queue):
            got = self._claim(cand)
            if got == "busy":
                if cand.num not in waiting:
                    waiting.add(cand.num)
                    log.info("[sweep] job #%d is %s: waiting for it", cand.num, cand.reason)
                continue
            queue.remove(cand)
            if got == "done":
                log.info("[sweep] job #%d: %s: not run again", cand.num, cand.reason)
                continue
            return cand
        return None

    def _run_sequential(self, to_run: list[Job]) -> list:
        returns = []
        queue, waiting = list(to_run), set()
        while queue:
            stop = self.over_budget()
            if stop:
                log.warning("[sweep] %s: %d run(s) not started (status pending)", stop, len(queue))
                for rest in queue:
                    write_json_atomic(self.sweep_dir / rest.dir / "status.json",
                                      {**(read_result(self.sweep_dir / rest.dir).info or {}), "status": "pending",
                                       "reason": stop, "time": time.time()})
                break
            try:
                j = self._next(queue, waiting)
            except KeyboardInterrupt:
                self._stopped()
                log.error("[sweep] interrupted while waiting for another sweep's runs: stopping the sweep")
                break
            if j is None:  # every job left is being run by another sweep process: wait for it
                if queue:
                    time.sleep(1.0)
                continue
            i = to_run.index(j)
            try:
                est = f", estimate {fmt_s(j.estimate_s)}" if j.estimate_s is not None else ""
                log.info("[sweep] run %d/%d (job #%d -> %s/): %s%s | so far: %s", i + 1, len(to_run), j.num, j.dir,
                         " ".join(j.record()["overrides"]), est, progress(self.sweep_dir, to_run[:i]))
                t0 = time.time()
                try:
                    returns.append(self.launcher.launch([j.overrides], initial_job_idx=j.num))
                except KeyboardInterrupt:
                    mark_unfinished(self.sweep_dir / j.dir, j.cfg, "interrupted", "KeyboardInterrupt",
                                    "Ctrl-C (KeyboardInterrupt) in the sweep process")
                    self._stopped()
                    log.error("[sweep] interrupted during run %d/%d: stopping the sweep", i + 1, len(to_run))
                    break
                ret = returns[-1][0] if returns[-1] else None
                if ret is not None and ret.status == JobStatus.FAILED:  # the task function itself raised
                    e = ret._return_value
                    log.error("[sweep] job #%d raised %s: %s", j.num, type(e).__name__, e, exc_info=e)
                    mark_unfinished(self.sweep_dir / j.dir, j.cfg, "failed", type(e).__name__,
                                    f"the job raised {type(e).__name__}: {e}")
                r = read_result(self.sweep_dir / j.dir)
                status = r.status if r else "unknown"
                log.info("[sweep] run %d/%d (job #%d) ended %s in %.1f s", i + 1, len(to_run), j.num, status,
                         time.time() - t0)
                if status == "interrupted":
                    self._stopped()
                    log.error("[sweep] run %d/%d was interrupted: stopping the sweep (%d runs not started; "
                              "resume=true continues it)", i + 1, len(to_run), len(queue))
                    break
            finally:
                claims.release(self.sweep_dir, j.dir)
        return returns

    def _run_parallel(self, to_run: list[Job]) -> list:
        claimed = []
        for j in to_run:  # another sweep process's runs are not submitted again (not waited for either)
            if self._claim(j) == "run":
                claimed.append(j)
            else:
                log.info("[sweep] job #%d: %s: not submitted", j.num, j.reason)
        if not claimed:
            return []
        log.info("[sweep] launching %d runs at once through %s", len(claimed), type(self.launcher).__name__)
        if hasattr(self.launcher, "job_nums"):
            self.launcher.job_nums = [j.num for j in claimed]
        try:
            return [self.launcher.launch([j.overrides for j in claimed], initial_job_idx=0)]
        except KeyboardInterrupt:
            self._stopped()
            for j in claimed:
                mark_unfinished(self.sweep_dir / j.dir, j.cfg, "interrupted", "KeyboardInterrupt",
                                "Ctrl-C in the sweep process: job cancelled")
            log.error("[sweep] interrupted: submitted jobs cancelled")
            return []
        finally:
            for j in claimed:
                claims.release(self.sweep_dir, j.dir)

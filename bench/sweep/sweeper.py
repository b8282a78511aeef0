"""The sweeper (``hydra/sweeper=bench``): plan every job, record what will not run, run the rest
(bench/sweep/__init__.py says what the plan decides).  The sweep folder it shares with other sweep
processes (run folders, claims, the manifest) is bench/sweep/claims.py's :class:`SweepFolder`; the
running is bench/sweep/runner.py's :class:`Runner`."""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf

from bench.run.runs import FAILED, scan
from bench.spec.schema import BenchConfig
from bench.sweep.claims import SweepFolder
from bench.sweep.jobs import Job, compose, declare_preloads, expand, log_plan, subdir_override, write_plans
from bench.sweep.runner import Runner

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
        self.folder: Optional[SweepFolder] = None  # the sweep folder as this process shares it (sweep())
        self._gpus: Optional[int] = None

    def setup(self, *, hydra_context, task_function, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

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
            from bench.run.config import cuda_device_count

            self._gpus = cuda_device_count()
        return self._gpus

    def _gpu_memory_gib(self, run: BenchConfig) -> Optional[float]:
        fn = getattr(self.launcher, "gpu_memory_gib", None)
        return fn(run) if fn is not None else None

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
                job.dir = self.folder.choose(job, taken, prefer=[r.dir.name for r in again])
                return
        job.dir = self.folder.choose(job, taken)

    def plan(self, overrides: list[list[str]], first_num: int = 0) -> list[Job]:
        """Jobs for override lists (numbered from first_num), composed, validated, keyed and given a folder
        (nothing written)."""
        jobs = [Job(num=first_num + i, overrides=list(o)) for i, o in enumerate(overrides)]
        # run folders claimed by other live sweep processes are never chosen (bench/sweep/claims.py)
        self.folder.others(prune=False)
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
        manifest = {"started": time.time(), "sweep_dir": str(self.sweep_dir), "argv": sys.argv,
                    "resume": self.resume, "rerun_failed": self.rerun, "launcher": type(self.launcher).__name__,
                    "interrupted": False, "jobs": []}
        self.folder = SweepFolder(self.sweep_dir, manifest, self.resume)

    def execute(self, jobs: list[Job], plan_s: float = 0.0) -> list:
        """Log the plan, record what will not run, then run the rest (one at a time, or all at once)."""
        to_run = [j for j in jobs if j.action == "run"]
        if to_run and not self.dry:
            self.refuse_unsubmittable()
        cwd = Path(str(OmegaConf.select(self.config, "hydra.runtime.cwd", default=os.getcwd())))
        log_plan(jobs, to_run, self.sweep_dir, [self.sweep_dir, cwd / "multirun", *map(Path, map(str, self.history))],
                 self.resume, self.rerun, plan_s, self.dry)
        if self.dry:
            write_plans(self.sweep_dir, jobs)
            self.log_sbatch_script(to_run)
            log.info("[sweep] dry run: nothing run; each run's plan and prediction in %s/plans.json "
                     "(python -m multirun_analysis %s ranks them)", self.sweep_dir, self.sweep_dir)
            return []
        # each planned folder's status and the manifest, written holding the sweep folder's lock; each job
        # is claimed again just before it runs (bench/sweep/claims.py)
        self.folder.record(jobs, self.config)
        for j in to_run:
            j.overrides = list(j.overrides) + [subdir_override(j.dir)]
        declare_preloads(to_run)
        sequential = self.sequential
        if sequential is None:
            sequential = not getattr(self.launcher, "parallel_jobs", False)
        if not to_run:
            return []
        return Runner(self.folder, self.launcher, self.over_budget, self.run_ended).run(to_run, sequential)

    def log_sbatch_script(self, to_run: list[Job]) -> None:
        """A dry run through hydra/launcher=slurm: the batch script the first run's job would get."""
        fn = getattr(self.launcher, "sbatch_preview", None)
        if fn is None or not to_run:
            return
        try:
            script = fn(list(to_run[0].overrides) + [subdir_override(to_run[0].dir)])
        except Exception as e:  # no srun here: submitit will not build one
            log.info("[sweep] no sbatch script shown (submitit builds it only where SLURM's client is): %s",
                     " ".join(str(e).split()))
            return
        log.info("[sweep] the sbatch script of job #%d (each job is sized by its own world_size):\n%s",
                 to_run[0].num, script.rstrip())

    def refuse_unsubmittable(self) -> None:
        """Exit 2 with one line, before any run is recorded, where the launcher says nothing can be submitted
        (hydra/launcher=slurm without a SLURM client here, or with a partition the cluster lacks)."""
        fn = getattr(self.launcher, "preflight", None)
        why = fn() if fn is not None else None
        if why:
            print(f"bench: {why}; nothing was submitted", file=sys.stderr, flush=True)
            raise SystemExit(2)

    def over_budget(self) -> Optional[str]:
        """Why no further run should start (None: go on); the knob search stops at its GPU-time budget."""
        return None

    def run_ended(self, job: Job) -> None:
        """Called after each run that ends on its own, when runs go one at a time: nothing here (the knob search
        records what it has measured so far)."""

"""Submit each job of a sweep on its own, with its own size: a fresh submitit executor per job (no job
array: SLURM runs them in parallel).  A job sbatch refuses (GPUs, a partition or an account the
cluster lacks), or bench refuses before sbatch (ConfigError), is recorded ``failed`` with the reason in one
line (bench/launch/slurm/preflight.py ``refusal``), and the sweep goes on instead of ending with a traceback and
its runs left ``pending``; a refusal about the launcher's settings (account, partition, QOS) is the answer for
every job: the jobs after it are recorded with it, not submitted again."""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import DictConfig

from bench.launch.slurm.interrupt import cancel_unfinished
from bench.launch.slurm.preflight import refusal
from bench.launch.slurm.record import job_dir, leave_queued, log, mark_failed
from bench.spec.schema import ConfigError


def _repository_importable() -> None:
    """The tasks unpickle the launcher (hydra_plugins.bench_plugins) and bench: make the repository
    importable there whatever their working directory (local tasks and sbatch inherit the environment)."""
    import bench

    root = str(Path(bench.__file__).resolve().parents[1])
    pp = os.environ.get("PYTHONPATH", "")
    if root not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (root, pp) if x)


class JobSubmitter:
    """Mixin over hydra-submitit-launcher's launchers: ``launch`` submits every job with its own
    parameters (JobResources), then waits for all of them (JobCollector)."""

    _EXECUTOR: str
    parallel_jobs = False  # the bench sweeper launches jobs one at a time unless True
    job_nums: Optional[list[int]] = None  # set by the bench sweeper: the jobs' numbers
    _for_all: Optional[str] = None
    _said: set[str]  # the refusals logged so far in this launch
    params: dict
    config: Optional[DictConfig]
    hydra_context: Any

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None
        nums = list(self.job_nums) if self.job_nums and len(self.job_nums) == len(job_overrides) \
            else list(range(initial_job_idx, initial_job_idx + len(job_overrides)))
        self.job_nums = None
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        _repository_importable()
        submitted: list = []  # (num, overrides, sweep config, submitit job)
        refused: dict[int, JobReturn] = {}
        self._said = set()
        self._for_all = None  # a refusal that is every job's answer (the account, partition or QOS)
        try:
            for num, overrides in zip(nums, job_overrides):
                self._submit(num, list(overrides), submitted, refused)
            if not self.params.get("wait", True):  # submit and walk away: python -m bench.sweep.collect later
                done = leave_queued(self._EXECUTOR, Path(str(self.config.hydra.sweep.dir)), submitted)
            else:
                done = dict(zip([item[0] for item in submitted], self._collect(submitted)))
            return [refused[num] if num in refused else done[num] for num in nums]
        except KeyboardInterrupt:
            cancel_unfinished(self._EXECUTOR, submitted)
            raise

    def sbatch_preview(self, overrides: Sequence[str]) -> str:
        """The batch script sbatch would get for the job of ``overrides`` (a dry run prints it); building it needs
        srun here, as submitting does (submitit refuses without it)."""
        assert self.config is not None and self.hydra_context is not None
        sc = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        executor = self._executor()
        executor.update_parameters(**{**self._base_params(), **self._prefixed(self.job_resources(sc))})
        inner = executor._executor
        return inner._make_submission_file_text(inner._submitit_command_str, "preview")

    def _executor(self):
        """A fresh executor for each job: update_parameters merges, and None means "keep", so one
        executor reused across jobs would carry one job's size into the next."""
        import submitit

        init = {"folder": self.params["submitit_folder"]}
        if self.params.get("max_num_timeout") is not None and self._EXECUTOR == "slurm":
            init["slurm_max_num_timeout"] = self.params["max_num_timeout"]
        return submitit.AutoExecutor(cluster=self._EXECUTOR, **init)

    def _submit(self, num: int, overrides: list, submitted: list, refused: dict) -> None:
        """Size job ``num`` from its own config and submit it (appended to ``submitted``), or record why
        it was not (in ``refused``)."""
        sc = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        res = self.job_resources(sc)
        if self._for_all is not None:  # sbatch refused an earlier job for a setting all of them share
            refused[num] = self._refused(num, overrides, sc, self._for_all)
            return
        try:  # refused before sbatch: e.g. a time limit the time-limit warning could end at its start
            self.check_resources(res)
        except ConfigError as e:
            refused[num] = self._refused(num, overrides, sc, str(e))
            return
        try:
            executor = self._executor()
            executor.update_parameters(**{**self._base_params(), **self._prefixed(res)})
            with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's stderr: it is in the record
                job = executor.submit(self, overrides, "hydra.sweep.dir", num, f"job_id_for_{num}",
                                      Singleton.get_state())
        except Exception as e:  # sbatch refused it (GPUs, partition, account the cluster lacks):
            line, for_all = refusal(e, self.params)  # this run fails, the sweep goes on
            self._for_all = line if for_all else None
            refused[num] = self._refused(num, overrides, sc, line)
            return
        log.info("[%s] #%d submitted as %s: %s (%s)", self._EXECUTOR, num, job.job_id,
                 " ".join(filter_overrides(overrides)), ", ".join(f"{k}={v}" for k, v in res.items() if v is not None))
        submitted.append((num, overrides, sc, job))

    def _refused(self, num: int, overrides: list, sc: DictConfig, msg: str) -> JobReturn:
        """Record the run of a job that was not submitted ``failed``, with why (one line); the sweep goes on."""
        from bench.run.runs import read_result

        d = job_dir(sc, num)
        r = read_result(d) if d.is_dir() else None
        mark_failed(d, sc, msg, r.info if r else {})
        if msg not in self._said:  # each reason once; the sweep's summary counts the runs it ended
            self._said.add(msg)
            log.error("[%s] #%d: %s", self._EXECUTOR, num, msg)
        ret = JobReturn(overrides=overrides, working_dir=os.getcwd(), task_name="bench")
        ret.return_value = "failed"
        ret.status = JobStatus.COMPLETED  # recorded; the sweep goes on
        return ret

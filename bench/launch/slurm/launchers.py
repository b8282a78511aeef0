"""bench's two submitit launchers: hydra-submitit-launcher's, with each job sized, submitted and
waited for on its own (the mixins of this package)."""
from __future__ import annotations

from typing import Optional

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher, SlurmLauncher
from omegaconf import DictConfig

from bench.launch.slurm import preflight
from bench.launch.slurm.collect import JobCollector, squeue_states
from bench.launch.slurm.resources import JobResources, check_warning_time
from bench.launch.slurm.submit import JobSubmitter


class PerJobLauncher(JobSubmitter, JobCollector, JobResources):
    """Executor parameters per job (JobResources), submitted one by one (JobSubmitter) and waited for
    (JobCollector): hydra-submitit-launcher gives every job of a sweep the same size."""


class BenchSlurmLauncher(PerJobLauncher, SlurmLauncher):
    """hydra/launcher=slurm: one SLURM job per run, sized by its world_size; jobs run in parallel."""

    parallel_jobs = True

    def preflight(self) -> Optional[str]:
        """Why no job of the sweep can be submitted (no SLURM client, no such partition), in one line; None: go
        on.  The sweeper asks before it records any run (bench/launch/slurm/preflight.py)."""
        return preflight.check(self.params)

    def check_resources(self, res: dict) -> None:
        check_warning_time(res.get("timeout_min"), self.params.get("signal_delay_s"))

    def _queue_states(self, job_ids: list[str]) -> Optional[dict[str, tuple[str, str]]]:
        """squeue's word on when a job is over: submitit's sacct needs SLURM's accounting database, and
        without one (small clusters, tests/slurm_cluster.py) a job killed before it wrote its result
        (time limit, scancel, node failure) would never be seen to end: the sweep would wait forever."""
        return squeue_states(job_ids)


class BenchLocalLauncher(PerJobLauncher, LocalLauncher):
    """hydra/launcher=local_tasks: submitit's local executor, one task per rank on this machine."""

    def _node_gpus(self) -> Optional[int]:
        return None  # every task on this machine

    def _uses_gpu(self, cfg: DictConfig) -> bool:
        from bench.run.config import cuda_device_count

        return str(cfg.device) == "cuda" or (str(cfg.device) == "auto" and cuda_device_count() > 0)

    def precheck_gpus(self, cfg: dict) -> int:
        from bench.run.config import cuda_device_count

        return cuda_device_count()

"""hydra/launcher=slurm and hydra/launcher=local_tasks (code: bench.slurm); needs submitit."""
from bench.slurm import BenchLocalLauncher as _BenchLocalLauncher
from bench.slurm import BenchSlurmLauncher as _BenchSlurmLauncher


class BenchSlurmLauncher(_BenchSlurmLauncher):
    """One SLURM job per run, its tasks and GPUs following the run's world_size."""


class BenchLocalLauncher(_BenchLocalLauncher):
    """submitit's local executor with one task per rank, one run at a time (tests, a workstation)."""

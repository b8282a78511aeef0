"""hydra/launcher=slurm and hydra/launcher=local_tasks (code: bench/launch/slurm/); needs submitit."""
from bench.launch.slurm.launchers import BenchLocalLauncher as _BenchLocalLauncher
from bench.launch.slurm.launchers import BenchSlurmLauncher as _BenchSlurmLauncher


class BenchSlurmLauncher(_BenchSlurmLauncher):
    """One SLURM job per run, its tasks and GPUs following the run's world_size."""


class BenchLocalLauncher(_BenchLocalLauncher):
    """submitit's local executor with one task per rank, one run at a time (tests, a workstation)."""

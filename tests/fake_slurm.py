"""A stand-in SLURM client for tests on a machine without SLURM (tests/slurm_cluster.py starts a real one where
SLURM is installed): ``sbatch`` runs the given shell lines; ``srun``, ``squeue`` and ``scancel`` are there (submitit
and bench's pre-check look for them) and do nothing; ``sinfo`` lists the given partitions (``debug*``: the default)."""
from __future__ import annotations

import os
from pathlib import Path


def fake_slurm(folder: Path, sbatch: str, partitions: str = "debug*") -> dict:
    """Write the commands into ``folder``; returns an environment with them first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    scripts = {"sbatch": sbatch, "srun": "exit 0", "squeue": "exit 0", "scancel": "exit 0",
               "sinfo": f"printf '%s\\n' {' '.join(partitions.split())}"}
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("SUBMITIT_EXECUTOR", None)
    return env

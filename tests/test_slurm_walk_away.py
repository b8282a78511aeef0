"""Submit and walk away (issue 51, item 1), with a stand-in SLURM client (tests/fake_slurm.py: sbatch accepts
every job and numbers it; squeue prints what the test says SLURM holds):

* ``hydra/launcher=slurm hydra.launcher.wait=false``: the sweep returns once its jobs are queued, exit 0, printing
  their job ids and the sweep folder; ``<sweep dir>/queued.json`` names each job's run folder and id;
* ``python -m bench.sweep.collect <sweep dir>``: while SLURM lists the jobs, their state (exit 0, no summary yet);
  once SLURM no longer lists them and their runs recorded no final status, the runs are recorded ``failed``
  with why (a job pending for a reason SLURM never gets past is cancelled), the summary is written, exit 1;
* a dry run through the launcher prints the sbatch script a job would get.
tests/test_slurm_real.py runs jobs for real on a one-node SLURM cluster where SLURM is installed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.fake_slurm import fake_slurm

RUN = ["strategy=single", "device=cpu", "precision=fp32", "steps=2", "warmup_steps=1"]


def _run(env: dict, *args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=180, env=env)
    return p.returncode, p.stdout + p.stderr


def test_submit_and_walk_away_then_collect(tmp_path):
    n, queue = tmp_path / "n", tmp_path / "squeue.txt"
    env = fake_slurm(tmp_path / "bin", f'i=$(cat {n} 2>/dev/null || echo 40); i=$((i+1)); echo $i > {n}; '
                                       'echo "Submitted batch job $i"')
    (tmp_path / "bin" / "squeue").write_text(f"#!/bin/sh\ncat {queue}\n")
    sweep = tmp_path / "sweep"
    code, out = _run(env, "-m", "bench", "--multirun", "hydra/launcher=slurm", "hydra.launcher.wait=false", *RUN,
                     "seed=0,1", "world_size=1,2", f"hydra.sweep.dir={sweep}")
    assert code == 0, out[-3000:]
    assert f"[sweep] QUEUED 2 of 4 runs as SLURM jobs 41, 42 in {sweep} (invalid=2" in out, out[-3000:]
    assert f"python -m bench.sweep.collect {sweep}" in out and "SUMMARY" not in out
    queued = json.loads((sweep / "queued.json").read_text())
    assert {k: (v["dir"], v["job_id"]) for k, v in queued.items()} == {"0": ("0", "41"), "2": ("2", "42")}
    assert json.loads((sweep / "0" / "status.json").read_text())["status"] == "pending"

    queue.write_text("41|RUNNING|None\n42|PENDING|Priority\n")
    code, out = _run(env, "-m", "bench.sweep.collect", str(sweep))
    assert code == 0, out[-3000:]
    assert "#0 0/: SLURM job 41 RUNNING (None)" in out and "#2 2/: SLURM job 42 PENDING (Priority)" in out
    assert "2 of 4 runs still queued or running" in out and not (sweep / "summary.json").exists()

    queue.write_text("42|PENDING|PartitionConfig\n")  # 41 is over; 42 will never start
    code, out = _run(env, "-m", "bench.sweep.collect", str(sweep), "--no-analysis")
    assert code == 1, out[-3000:]
    assert "SUMMARY 4 runs: completed=0 invalid=2 skipped=0 failed=2" in out, out[-3000:]
    st0 = json.loads((sweep / "0" / "status.json").read_text())
    st2 = json.loads((sweep / "2" / "status.json").read_text())
    assert st0["status"] == "failed" and "SLURM job 41 is over (squeue no longer lists it)" in st0["reason"], st0
    assert st2["status"] == "failed" and "SLURM cannot start job 42" in st2["reason"], st2
    assert json.loads((sweep / "summary.json").read_text())["exit_code"] == 1


def test_a_dry_run_shows_the_sbatch_script(tmp_path):
    env = fake_slurm(tmp_path / "bin", "exit 1")
    code, out = _run(env, "-m", "bench", "hydra/launcher=slurm", "model=llama3_8b", "strategy=fsdp", "world_size=16",
                     "model.global_batch=32", "hardware=h100_sxm_80gb", "dry_run=true", "hydra.launcher.partition=debug",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert code == 0, out[-3000:]
    assert "the sbatch script of job #0" in out
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=debug", "srun --unbuffered"):
        assert line in out, (line, out[-3000:])

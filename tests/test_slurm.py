"""The SLURM code path on this machine: hydra/launcher=local_tasks (submitit's local executor, one
task per rank, bench/slurm.py). Each task is a rank: rank, world size and master address come from
submitit's environment (no torchrun, no elastic agent); rank 0 writes metrics.json and status.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def test_two_submitit_tasks_run_one_gloo_ddp_job(tmp_path):
    sweep = tmp_path / "multirun"
    args = [sys.executable, "-m", "bench", "--multirun", "hydra/launcher=local_tasks", "strategy=ddp",
            "world_size=2", "device=cpu", "precision=fp32", "steps=3", "warmup_steps=1", "run_timeout_s=120",
            f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "tasks_per_node=2" in out  # the job was sized by its world_size
    run = sweep / "0"
    m = json.loads((run / "metrics.json").read_text())
    st = json.loads((run / "status.json").read_text())
    assert m["status"] == st["status"] == "completed", m.get("error")
    assert len(m["ranks"]) == 2 and sorted(r["rank"] for r in m["ranks"]) == [0, 1]
    assert m["throughput"]["tokens_per_step"] == 8 * 128  # both halves of the global batch
    assert m["layout"]["dp"] == 2
    # ran as submitit tasks (not through torch elastic): the job id is recorded, and each task's log
    # shows its rank from submitit's environment
    assert st["submitit_job_id"] and st["key"] == m["job"]["key"]
    logs = sorted((sweep / ".submitit").rglob("*_log.out"))
    assert len(logs) == 2
    assert "global_rank=0(2)" in logs[0].read_text() and "global_rank=1(2)" in logs[1].read_text()
    assert (run / "rank0.json").exists() and (run / "rank1.json").exists()
    assert st["overhead_s"] > 0 and st["wall_s"] >= st["overhead_s"]

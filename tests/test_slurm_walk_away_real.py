"""Submit and walk away on a real one-node SLURM cluster (tests/slurm_cluster.py; skipped, with the reason,
where SLURM is not installed): ``hydra.launcher.wait=false`` returns once the job is queued (exit 0, its id and
the sweep folder printed); the job runs on without the process that submitted it; ``python -m
bench.sweep.collect <sweep dir> --wait`` then reports it completed from the folder, writes the summary and runs
the analysis on it.  One job: the test stays short (about 30 s on 2 cores).  tests/test_slurm_walk_away.py checks the same with a stand-in client, and what
collect records for jobs that ended without a status.

    pytest -k "slurm and walk_away"
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import REPO
from tests.slurm_cluster import start

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm():
    root = tempfile.mkdtemp(prefix="bench-slurm-")
    cluster, reason = start(root, oversubscribe=4)
    if cluster is None:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"real SLURM not available: {reason}")
    try:
        yield cluster
    finally:
        cluster.down()


def test_submit_walk_away_and_collect_later(slurm, tmp_path):
    env = {**slurm.env, "PYTHONUNBUFFERED": "1"}
    sweep = tmp_path / "sweep"
    p = subprocess.run([sys.executable, "-m", "bench", "--multirun", "hydra/launcher=slurm", "hydra.launcher.wait=false",
                        "strategy=single", "device=cpu", "precision=fp32", "steps=4", "warmup_steps=1",
                        f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True, timeout=180, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    queued = json.loads((sweep / "queued.json").read_text())
    jid = queued["0"]["job_id"]
    assert f"[sweep] QUEUED 1 of 1 runs as SLURM jobs {jid} in {sweep}" in out, out[-3000:]
    assert "SUMMARY" not in out  # the submitting process did not wait for the jobs

    p = subprocess.run([sys.executable, "-m", "bench.sweep.collect", str(sweep), "--wait", "--poll-s", "2"], cwd=REPO,
                       capture_output=True, text=True, timeout=400, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "SUMMARY 1 runs: completed=1" in out, out[-3000:]
    st = json.loads((sweep / queued["0"]["dir"] / "status.json").read_text())
    assert st["status"] == "completed" and st["submitit_job_id"] == jid, st
    assert json.loads((sweep / "summary.json").read_text())["exit_code"] == 0
    assert (sweep / "analysis" / "report.md").exists(), out[-3000:]

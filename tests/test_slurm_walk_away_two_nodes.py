"""Submit and walk away on the two-node SLURM cluster (tests/slurm_cluster.py ``--nodes 2``: one network namespace
per node; skipped, with the reason, where SLURM, root or iproute2 is missing): a DDP run of 2 ranks, one per
node, submitted with ``hydra.launcher.wait=false`` (the command returns once the job is queued), then ``python -m
bench.sweep.collect <sweep dir> --wait`` reports it completed, its ranks on node1 and node2.  The one-node
cluster's test (tests/test_slurm_walk_away_real.py) also runs the analysis.

    pytest -k "slurm and walk_away and two_nodes"
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import CPU_FAST, REPO
from tests.test_slurm_two_nodes import GLOO_IF, two_nodes  # noqa: F401 - the module's cluster fixture

pytestmark = pytest.mark.slow


def test_walk_away_from_a_run_across_two_nodes(two_nodes, tmp_path):
    env = {**two_nodes.env, "PYTHONUNBUFFERED": "1"}
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "bench", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=1",
            "hydra.launcher.timeout_min=10", "hydra.launcher.wait=false", GLOO_IF, *CPU_FAST, "strategy=ddp",
            "world_size=2", f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(two_nodes.client(args), cwd=REPO, capture_output=True, text=True, timeout=180, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    jid = json.loads((sweep / "queued.json").read_text())["0"]["job_id"]
    assert f"[sweep] QUEUED 1 of 1 runs as SLURM jobs {jid} in {sweep}" in out and "nodes=2" in out, out[-3000:]

    p = subprocess.run(two_nodes.client([sys.executable, "-m", "bench.sweep.collect", str(sweep), "--wait", "--poll-s",
                                         "2", "--no-analysis"]), cwd=REPO, capture_output=True, text=True,
                       timeout=400, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "SUMMARY 1 runs: completed=1" in out, out[-4000:]
    m = json.loads((sweep / "0" / "metrics.json").read_text())
    assert m["status"] == "completed" and m["placement"]["nodes"] == {"node1": [0], "node2": [1]}, m["placement"]

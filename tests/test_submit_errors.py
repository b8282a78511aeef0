"""A submission that cannot be made is one line naming what is missing (issue 51, item 2):

* no SLURM client on PATH, or a partition the cluster does not have (``sinfo``): exit 2 before any run is
  recorded (bench/launch/slurm/preflight.py ``check``);
* sbatch refusing the account: each run ``failed`` with one line naming ``hydra.launcher.account``; sbatch is
  asked once, the other jobs get the same answer; the summary prints the reason once, with its count;
* a sweep none of whose runs can run (all invalid) exits 2 and prints each distinct reason once, with its count.

No SLURM runs here: tests/fake_slurm.py stands in for its client (tests/test_slurm_real.py and
tests/test_slurm_two_nodes.py submit to real clusters where SLURM is installed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.fake_slurm import fake_slurm

RUN = ["strategy=single", "device=cpu", "precision=fp32", "steps=2", "warmup_steps=1"]


def _bench(env: dict, *args: str) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=180, env=env)
    return p.returncode, p.stdout, p.stderr


def _records(sweep: Path) -> list[Path]:
    return sorted(sweep.rglob("status.json"))


def test_without_a_slurm_client_a_submission_is_one_line_and_exit_2(tmp_path):
    """The issue's command, on a machine whose PATH has no SLURM client (here, or CI's with SLURM installed)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    env.pop("SUBMITIT_EXECUTOR", None)
    sweep = tmp_path / "sweep"
    code, out, err = _bench(env, "model=llama3_8b", "strategy=fsdp", "world_size=16", "model.global_batch=32",
                            "hardware=h100_sxm_80gb", "submit=slurm", "hydra.launcher.partition=gpu",
                            f"hydra.sweep.dir={sweep}")
    assert code == 2, out + err
    assert err == ("bench: cannot submit to SLURM: sbatch, srun, squeue, scancel not on PATH (this machine has no "
                   "SLURM client): submit from the cluster's login node, or run here without submit=slurm / "
                   "hydra/launcher=slurm; nothing was submitted\n"), err
    assert "Traceback" not in out and not _records(sweep)  # no run left pending


def test_an_account_sbatch_refuses_fails_every_run_with_one_line(tmp_path):
    """sbatch asked once: the account is every job's, so the other two runs are recorded with the same answer."""
    calls = tmp_path / "sbatch_calls"
    env = fake_slurm(tmp_path / "bin", f"echo x >> {calls}\necho 'sbatch: error: Batch job submission failed: Invalid "
                                       "account or account/partition combination specified' >&2\nexit 1")
    sweep = tmp_path / "sweep"
    code, out, err = _bench(env, "--multirun", "hydra/launcher=slurm", *RUN, "seed=0,1,2", f"hydra.sweep.dir={sweep}")
    text = out + err
    assert code == 1, text[-3000:]
    assert calls.read_text().count("x") == 1
    line = ("could not be submitted to SLURM: no account: this cluster requires one, hydra.launcher.account=<your "
            "project> (sbatch: error: Batch job submission failed: Invalid account or account/partition combination "
            "specified)")
    statuses = [json.loads(p.read_text()) for p in _records(sweep)]
    assert [s["status"] for s in statuses] == ["failed"] * 3 and all(s["reason"] == line for s in statuses)
    assert f"3 failed (#0-#2): {line}" in text, text[-3000:]
    assert text.count("no account: this cluster requires one") == 2  # when it happened, and in the summary
    assert "Traceback" not in text


def test_a_sweep_none_of_whose_runs_can_run_exits_2_with_each_reason_once(tmp_path):
    sweep = tmp_path / "sweep"
    code, out, err = _bench({**os.environ}, "--multirun", *RUN, "world_size=2", "seed=0,1,2",
                            f"hydra.sweep.dir={sweep}")
    text = out + err
    assert code == 2, text[-3000:]
    assert "SUMMARY 3 runs: completed=0 invalid=3" in text and "exit=2" in text
    assert text.count("invalid config: world_size=2") == 1, text
    assert "3 invalid (#0-#2): invalid config: world_size=2: strategy=single runs on exactly 1 device" in text
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["exit_code"] == 2 and summary["counts"]["invalid"] == 3


def test_a_slurm_client_that_reaches_no_cluster_is_one_line(tmp_path, monkeypatch):
    """sinfo fails (no slurm.conf, no controller): nothing can be submitted; sinfo's error in the one line.  A
    cluster without a default partition needs one named; one it does not have is named with the valid ones."""
    from bench.launch.slurm.preflight import check

    env = fake_slurm(tmp_path / "bin", "exit 1")
    (tmp_path / "bin" / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: _establish_config_source: failed to "
                                            "fetch config' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", env["PATH"])
    assert check({}) == ("cannot submit to SLURM: SLURM's client here reaches no cluster (sinfo: sinfo: error: "
                         "_establish_config_source: failed to fetch config): submit from the cluster's login node "
                         "(SLURM_CONF names a cluster's slurm.conf)")
    fake_slurm(tmp_path / "bin", "exit 1", partitions="gpu cpu")
    assert check({"partition": None}) == ("cannot submit to SLURM: no partition: hydra.launcher.partition=null and the "
                                          "cluster has no default one; valid: gpu, cpu (sinfo)")
    assert check({"partition": "gpu"}) is None
    fake_slurm(tmp_path / "bin", "exit 1", partitions="debug* long")  # the sweeper exits 2 with it, as without a client
    assert check({"partition": "gpu"}) == ("cannot submit to SLURM: hydra.launcher.partition=gpu: the cluster has no "
                                           "partition gpu; valid: debug, long (sinfo)")

"""The SLURM code path on this machine: hydra/launcher=local_tasks (submitit's local executor, one
task per rank, bench/launch/slurm/). Each task is a rank: rank, world size and master address come from
submitit's environment (no torchrun, no elastic agent); rank 0 writes metrics.json and status.json.
Also hydra/launcher=slurm's refusal, before sbatch, of a time limit SLURM's warning could precede, and the
planning side of a submission from a machine without GPUs (a login node): hardware=<preset> planned for, a GPU
run without hardware= refused, one run submitted without --multirun (a fake sbatch: no cluster here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.fake_slurm import fake_slurm


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
    # where each rank ran (one machine: its hostname) and the master address, as every rank resolved it
    assert list(m["placement"]["nodes"].values()) == [[0, 1]] and m["placement"]["master_addr"]
    assert all(r["placement"]["master_ip"] and r["placement"]["local_rank"] == r["rank"] for r in m["ranks"])
    assert sorted(p.name for p in run.glob("node_rank*.json")) == ["node_rank0.json", "node_rank1.json"]


def test_a_failure_on_several_nodes_names_the_node():
    """The root cause's lost connection names the node it pointed to, and whether that node's ranks left
    any record; a peer at a loopback address says how to fix it; one node, or a root cause that is not a
    lost connection, adds nothing (tests/test_slurm_two_nodes.py runs it on two real SLURM nodes)."""
    from bench.machine.placement import node_note

    at = {0: "10.0.0.1", 1: "10.0.0.1", 2: "10.0.0.2", 3: "10.0.0.2"}
    nodes = {r: {"node": f"n{1 + r // 2}", "addresses": [a, "172.17.0.1"]} for r, a in at.items()}  # docker0: on both
    reset = "[pair.cc:537] Read error [10.0.0.2]:43727: Connection reset by peer"
    assert node_note([{"rank": 0, "message": reset}, {"rank": 1, "message": "closed by peer [10.0.0.1]:1"}], nodes) == (
        "lost node n2 (ranks 2-3): the connection to it (10.0.0.2) failed; its ranks left no failure record: they "
        "were killed, or the node died")
    assert node_note([{"rank": 0, "message": reset}, {"rank": 3, "message": reset}], nodes) == (
        "lost node n2 (ranks 2-3): the connection to it (10.0.0.2) failed")
    loop = node_note([{"rank": 2, "message": "SO_ERROR: Connection refused, remote=[127.0.0.1]:31138"}], nodes)
    assert "loopback" in loop and "GLOO_SOCKET_IFNAME" in loop
    assert node_note([{"rank": 1, "message": "injected fault"}, {"rank": 0, "message": reset}], nodes) is None
    assert node_note([{"rank": 0, "message": "[172.17.0.1]:5 reset"}], nodes) is None  # an address of both
    assert node_note([{"rank": 0, "message": reset}], {r: {**p, "node": "n1"} for r, p in nodes.items()}) is None


def test_a_job_slurm_will_never_start_is_over():
    """Pending for a reason SLURM will not get past as the cluster is configured (PartitionConfig: more
    nodes than the partition has): over, cancelled, recorded failed; a passing reason is not."""
    from bench.launch.slurm.collect import JobCollector, never_starts

    assert never_starts(("PENDING", "PartitionConfig")) and never_starts(("PENDING", "BadConstraints"))
    for passing in (("PENDING", "Resources"), ("PENDING", "ReqNodeNotAvail, UnavailableNodes:n2"),
                    ("PENDING", "PartitionNodeLimit"), ("RUNNING", "None"), None):
        assert not never_starts(passing)

    class Job:
        job_id, cancelled = "42", False

        def cancel(self, check: bool = True) -> None:
            self.cancelled = True

    job, c = Job(), JobCollector()
    c._EXECUTOR = "slurm"
    assert not c._over(job, {"42": ("PENDING", "Resources")}, True) and not job.cancelled
    assert c._over(job, {"42": ("PENDING", "PartitionConfig")}, True) and job.cancelled


def test_time_limit_warning_that_could_come_at_the_start_is_refused():
    """SLURM sends submitit's time-limit warning (USR2) signal_delay_s before the limit, up to 60 s
    earlier: with a limit that short it can come at the job's start, before bench's handler is in place,
    and end the tasks (USR2's default action).  bench refuses such a job, naming the keys."""
    from bench.launch.slurm.resources import check_warning_time
    from bench.spec.schema import ConfigError

    with pytest.raises(ConfigError) as e:
        check_warning_time(1, 120)
    assert e.value.key == "hydra.launcher.timeout_min" and e.value.value == 1
    assert "hydra.launcher.signal_delay_s=120" in str(e.value)
    assert "valid: timeout_min*60 > signal_delay_s + 60" in str(e.value)
    assert "hydra.launcher.timeout_min=4" in str(e.value)
    with pytest.raises(ConfigError, match="signal_delay_s=59"):
        check_warning_time(2, 60)  # 120 s: the warning may come 60 + 60 s before the limit
    check_warning_time(2, 10)
    check_warning_time(60, 120)  # conf/hydra/launcher/slurm.yaml's defaults
    check_warning_time(None, None)  # submitit's defaults: 5 min, 90 s


def test_slurm_job_the_warning_could_end_at_its_start_is_not_submitted(tmp_path):
    """hydra/launcher=slurm with hydra.launcher.timeout_min=1 (signal_delay_s=120 from slurm.yaml): the
    run is recorded failed with the ConfigError, sbatch is never called, the sweep ends with its summary."""
    called = tmp_path / "sbatch_called"
    env = fake_slurm(tmp_path / "bin", f"touch {called}\nexit 1")
    sweep = tmp_path / "multirun"
    args = [sys.executable, "-m", "bench", "--multirun", "hydra/launcher=slurm", "hydra.launcher.timeout_min=1",
            "strategy=single", "device=cpu", "precision=fp32", "steps=2", "warmup_steps=1", f"hydra.sweep.dir={sweep}"]
    p = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=240, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-4000:]
    assert not called.exists(), out[-4000:]
    st = json.loads((sweep / "0" / "status.json").read_text())
    m = json.loads((sweep / "0" / "metrics.json").read_text())
    assert st["status"] == m["status"] == "failed", st
    assert "invalid config: hydra.launcher.timeout_min=1: with hydra.launcher.signal_delay_s=120" in st["reason"]
    assert "invalid config: hydra.launcher.timeout_min=1" in out and "SUMMARY" in out


# ------------------------------------------------------------------ planning on a login node (no cluster)
def _cfg(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from bench.run.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def _gpu_visible() -> bool:
    from bench.run.config import cuda_device_count

    return cuda_device_count() > 0


@pytest.mark.skipif(_gpu_visible(), reason="the login node of this test has no GPU")
def test_a_run_submitted_to_slurm_is_planned_for_the_preset_on_a_machine_without_gpus(monkeypatch):
    """submit=slurm (what hydra/launcher=slurm sets) with hardware=a100_80gb on this CPU machine: planned for
    the A100 (device, memory, peak, tuning=best's GPU), as the sweeper plans it (GPUs: its world size); a run
    here, or the submitted job where it lands without that GPU, is refused naming it."""
    from bench.run.config import validate
    from bench.machine.hardware_rules import planned_device_name
    from bench.plan.memory_model import memory_plan
    from bench.plan.predict import terms
    from bench.spec.schema import ConfigError

    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    c = _cfg("submit=slurm", "hardware=a100_80gb", "strategy=ddp", "world_size=2", "tuning=best")
    plan = validate(c, gpus=2)
    assert plan.device == "cuda" and plan.backend == "nccl" and plan.cfg["precision"] == "bf16"
    mem = memory_plan(plan)
    assert mem["device_memory_gib"] == 79.2 and mem["device_memory_source"] == "hardware=a100_80gb"
    assert terms(plan)["peak"] == pytest.approx(312e12)  # the A100's dense bf16 datasheet peak
    assert planned_device_name(c, 2) == "NVIDIA A100-SXM4-80GB"
    assert "CPU run" not in str(plan.tuning)  # tuning=best looked up the A100, not this CPU
    with pytest.raises(ConfigError, match=r"describes NVIDIA A100-SXM4-80GB, and this machine .* has no GPU"):
        validate({**c, "submit": None}, gpus=0)  # a run here
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")  # the job, on a node without that GPU
    with pytest.raises(ConfigError, match=r"describes NVIDIA A100-SXM4-80GB, and this job's node .* has no GPU"):
        validate(c, gpus=0)


@pytest.mark.skipif(_gpu_visible(), reason="the login node of this test has no GPU")
def test_a_gpu_run_submitted_without_hardware_from_a_machine_without_gpus_is_refused(monkeypatch):
    from bench.run.config import validate
    from bench.spec.schema import ConfigError

    monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
    with pytest.raises(ConfigError) as e:
        validate(_cfg("submit=slurm"), gpus=1)
    assert (e.value.key, e.value.value) == ("hardware", "auto")
    assert "name the cluster's GPU, hardware=<preset> or a probe profile" in str(e.value)
    assert "a100_80gb" in str(e.value) and "device=cpu" in str(e.value)
    assert validate(_cfg("submit=slurm", "device=cpu"), gpus=0).device == "cpu"  # CPU nodes: planned as CPU
    with pytest.raises(ConfigError, match="device='cpu': contradicts hardware=h100_sxm_80gb"):
        validate(_cfg("submit=slurm", "hardware=h100_sxm_80gb", "device=cpu"), gpus=0)


def test_hydra_launcher_slurm_without_multirun_is_a_one_job_submission():
    from bench.__main__ import SINGLE_RUN_EXIT, submit_argv

    exit_cb = f"hydra.callbacks.bench_sweep._target_={SINGLE_RUN_EXIT}"
    assert submit_argv(["hydra/launcher=slurm", "steps=2"]) == [
        "--multirun", "hydra/launcher=slurm", "steps=2", "submit=slurm", exit_cb]
    assert submit_argv(["submit=slurm"]) == ["--multirun", "submit=slurm", "hydra/launcher=slurm", exit_cb]
    # the overrides first, as one run of words, then Hydra's options (tests/test_cli_errors.py: Hydra's flags)
    assert submit_argv(["-m", "hydra/launcher=slurm"]) == ["hydra/launcher=slurm", "submit=slurm", "-m"]
    assert submit_argv(["--cfg", "job", "submit=slurm"]) == ["submit=slurm", "hydra/launcher=slurm", "--cfg", "job"]
    assert submit_argv(["hydra/launcher=local_tasks", "x=1"]) == ["hydra/launcher=local_tasks", "x=1"]
    with pytest.raises(SystemExit, match="submit=slurm contradicts hydra/launcher=local_tasks"):
        submit_argv(["submit=slurm", "hydra/launcher=local_tasks"])


def test_one_run_is_submitted_without_multirun(tmp_path):
    """``python -m bench hydra/launcher=slurm hardware=a100_80gb`` on this CPU machine: planned for the A100 and
    handed to sbatch as a one-job sweep (one GPU asked for; this fake sbatch refuses it: the run is recorded
    failed, exit 1); without hardware= it is refused before sbatch, in one line, exit 2 as a single run."""
    script = tmp_path / "sbatch_script"
    env = {**fake_slurm(tmp_path / "bin", f'cat "$@" > {script}\necho "sbatch: error: no such cluster" >&2\nexit 1'),
           "CUDA_VISIBLE_DEVICES": ""}

    def submit(sweep, *overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "bench", "hydra/launcher=slurm", "steps=2", "warmup_steps=1",
                               *overrides, f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True,
                              timeout=240, env=env)

    p = submit(tmp_path / "a100", "hardware=a100_80gb")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-4000:]
    assert "#SBATCH --gpus-per-node=1" in script.read_text()
    st = json.loads((tmp_path / "a100" / "0" / "status.json").read_text())
    assert st["status"] == "failed" and "could not be submitted" in st["reason"] and st["precision"] == "bf16", st
    assert "[sweep] SUMMARY 1 runs" in out
    script.unlink()
    p = submit(tmp_path / "auto")
    out = p.stdout + p.stderr
    assert p.returncode == 2, out[-4000:]
    assert not script.exists()
    st = json.loads((tmp_path / "auto" / "0" / "status.json").read_text())
    assert st["status"] == "invalid" and "name the cluster's GPU" in st["reason"], st

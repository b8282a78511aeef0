"""hydra/launcher=slurm against a real SLURM: a one-node cluster on this machine (tests/slurm_cluster.py:
munged, slurmctld and slurmd from Debian's slurmctld/slurmd/slurm-client/munge packages).  Skipped,
with the reason, where SLURM is not installed or its daemons cannot start.

    pytest -k "slurm and real"

Two sweeps run side by side through sbatch/srun (CPU, tiny model, a few steps):

* A: ``strategy=single,ddp world_size=1,2``: three SLURM jobs (single and ddp with one task, ddp with
  two tasks over gloo), all completed; single with world_size=2 is invalid (no job submitted);
* B: ``strategy=ddp world_size=1,2 fault.kind=hang hydra.launcher.timeout_min=2
  hydra.launcher.signal_delay_s=10``: the one-task run hangs until SLURM ends it at its time limit
  (status ``timeout``); the two-task run is cancelled with scancel while it runs (status ``failed``,
  the reason says so).  The time limit is set so SLURM's time-limit warning (USR2, signal_delay_s
  before the limit and up to 60 s earlier) cannot come at the jobs' start, where it ended the tasks
  before bench could handle it (bench refuses such a job: tests/test_slurm.py);
* C: one hanging run, and Ctrl-C (SIGINT) to the sweep process while it runs: the job is cancelled, the
  run stays ``interrupted`` (resume=true runs it again), the sweep exits 130.
* D: ``device=cuda hardware=a100_80gb``: planned for the A100 here (no GPU), but the cluster has no GPUs (no
  GRES), sbatch refuses the job: the run is ``failed`` with sbatch's error, the sweep goes on and ends with
  its summary.

A second test submits single runs without ``--multirun`` from a process that sees no GPU, planned for a probe
profile of this machine's CPU (``python -m bench.probe``): it completes; planned for another CPU's profile, the
job refuses where it landed (``invalid``, naming both).

Then: every run's status.json / metrics.json, the summaries, and no SLURM job left in squeue and no
process of the test's jobs left on the machine.  The test waits on SLURM's own job states (squeue),
not on timings: a job SLURM has ended before the test saw it run fails the test at once, with its state.
SLURM checks time limits every 30 s, so the time-limited job ends 120 to 150 s after it started: the test
takes about 2.5 to 3 minutes.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, fault_env, processes_left
from tests.slurm_cluster import read_json as _json, start, stop_all, wait_job_running, wait_sweep as _wait

pytestmark = pytest.mark.slow

FAST = ["device=cpu", "precision=fp32", "steps=4", "warmup_steps=1"]


@pytest.fixture(scope="module")
def slurm():
    """A one-node SLURM cluster for this module (skipped, with the reason, where it cannot start)."""
    root = tempfile.mkdtemp(prefix="bench-slurm-")  # short: the munge socket path must fit a unix socket
    # oversubscribe: the test's 6 jobs (8 tasks, mostly idle) share this machine's CPUs
    cluster, reason = start(root, oversubscribe=6)
    if cluster is None:
        shutil.rmtree(root, ignore_errors=True)
        print(f"real SLURM not available: {reason}")
        pytest.skip(f"real SLURM not available: {reason}")
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def sweep():
    """Start `python -m bench --multirun hydra/launcher=slurm ...` (output in <sweep dir>.log); a sweep
    still running when the test ends (it failed) is killed."""
    procs: list[subprocess.Popen] = []

    def _start(sweep_dir: Path, env: dict, *overrides: str) -> subprocess.Popen:
        args = [sys.executable, "-m", "bench", "--multirun", "hydra/launcher=slurm", *FAST, *overrides,
                f"hydra.sweep.dir={sweep_dir}"]
        with open(sweep_dir.with_suffix(".log"), "w") as log:
            # SIGINT as in a terminal (a background job of a non-interactive shell inherits it ignored)
            procs.append(subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)))
        return procs[-1]
    yield _start
    stop_all(procs)


def _when_running(slurm, run: Path, log: Path, ranks: int, timeout: float = 300) -> str:
    """The job id of the run folder ``run`` once SLURM runs it and each of its ``ranks`` has started (its
    rank log: its signal handlers are in place) and status.json names the job."""
    def ready(jid: str) -> bool:
        return all((run / f"rank{r}.log").exists() for r in range(ranks)) and \
            _json(run / "status.json").get("submitit_job_id") == jid
    return wait_job_running(run, log, slurm.job_state, ready, timeout, f"running its {ranks} rank(s)")


def test_real_slurm_sweep(slurm, sweep, tmp_path):
    t_start = time.time()
    tag = fault_env()  # every process of the test's jobs carries it (sbatch exports the environment)
    env = {**slurm.env, "PYTHONUNBUFFERED": "1", **tag}
    good, bad, stop = tmp_path / "good", tmp_path / "bad", tmp_path / "stop"
    pa = sweep(good, env, "strategy=single,ddp", "world_size=1,2", "hydra.launcher.timeout_min=10")
    pb = sweep(bad, env, "strategy=ddp", "world_size=1,2", "fault.kind=hang", "fault.step=1",
                "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=10")
    pc = sweep(stop, env, "strategy=single", "fault.kind=hang", "fault.step=1", "seed=7")

    # once SLURM runs them and every rank has started: scancel B's two-task run, Ctrl-C to C
    cancelled = _when_running(slurm, bad / "1", bad.with_suffix(".log"), ranks=2)
    subprocess.run(["scancel", cancelled], env=slurm.env, check=True, timeout=30)
    interrupted = _when_running(slurm, stop / "0", stop.with_suffix(".log"), ranks=1)
    pc.send_signal(signal.SIGINT)

    refused = tmp_path / "refused"
    pd = sweep(refused, env, "strategy=single", "device=cuda", "hardware=a100_80gb")  # planned for it, here
    out_d = _wait(pd, refused.with_suffix(".log"), 180)
    out_c = _wait(pc, stop.with_suffix(".log"), 120)
    out_a = _wait(pa, good.with_suffix(".log"), 300)
    out_b = _wait(pb, bad.with_suffix(".log"), 360)  # its time-limited job: 2 min after it started
    elapsed = time.time() - t_start

    # A: three SLURM jobs completed, one invalid combination recorded without a job
    assert pa.returncode == 0, out_a[-4000:]
    sa = _json(good / "summary.json")
    assert sa["counts"]["completed"] == 3 and sa["counts"]["invalid"] == 1, sa["counts"]
    assert "[sweep] SUMMARY 4 runs: completed=3 invalid=1" in out_a
    assert "tasks_per_node=2" in out_a and "tasks_per_node=1" in out_a  # each job sized by its world_size
    runs = {(r["strategy"], r["world_size"]): r for r in sa["rows"]}
    for (strategy, ws), row in runs.items():
        d = good / row["dir"]
        st, m = _json(d / "status.json"), _json(d / "metrics.json")
        if (strategy, ws) == ("single", 2):
            assert st["status"] == m["status"] == "invalid" and "world_size" in st["reason"]
            assert not st.get("submitit_job_id")  # never submitted
            continue
        assert st["status"] == m["status"] == "completed", (strategy, ws, st, m.get("error"))
        assert st["submitit_job_id"], st  # ran as a SLURM job
        assert m["loss"]["first"] > 0 and m["loss"]["last"] > 0
        assert m["throughput"]["tokens_per_s"] > 0
        assert sorted(r["rank"] for r in m["ranks"]) == list(range(ws))
        assert all((d / f"rank{r}.log").exists() for r in range(ws))
        # one submitit task per rank: its log in <sweep>/.submitit/<job id>/<job id>_<task>_log.out
        logs = sorted((good / ".submitit" / st["submitit_job_id"]).glob("*_log.out"))
        assert len(logs) == ws, logs
        for r in range(ws):
            assert f"global_rank={r}({ws})" in logs[r].read_text()
    ws2 = _json(good / runs[("ddp", 2)]["dir"] / "metrics.json")
    assert ws2["layout"]["dp"] == 2 and ws2["throughput"]["tokens_per_step"] == 8 * 128

    # B: SLURM's time limit -> timeout; scancel -> failed; both with the reason, none left without a status
    assert pb.returncode == 1, out_b[-4000:]
    sb = _json(bad / "summary.json")
    assert sb["counts"]["timeout"] == 1 and sb["counts"]["failed"] == 1, (sb["counts"], out_b[-3000:])
    assert sb["counts"]["unknown"] == 0 and sb["counts"]["completed"] == 0
    st0, m0 = _json(bad / "0" / "status.json"), _json(bad / "0" / "metrics.json")
    assert st0["status"] == m0["status"] == "timeout", (st0, m0.get("error"))
    assert "time limit" in st0["reason"] and "time limit" in m0["error"]["message"], st0["reason"]
    st1, m1 = _json(bad / "1" / "status.json"), _json(bad / "1" / "metrics.json")
    assert st1["status"] == m1["status"] == "failed", (st1, m1.get("error"))
    assert st1["submitit_job_id"] == cancelled
    assert "scancel" in st1["reason"] and m1["error"]["type"] == "Cancelled", st1["reason"]

    # C: Ctrl-C cancelled its job; the run stays interrupted (the ranks' SIGTERM did not make it "failed")
    assert pc.returncode == 130, out_c[-4000:]
    sc = _json(stop / "summary.json")
    assert sc["counts"]["interrupted"] == 1, sc["counts"]
    st = _json(stop / "0" / "status.json")
    assert st["status"] == _json(stop / "0" / "metrics.json")["status"] == "interrupted", st
    assert st["submitit_job_id"] == interrupted and "Ctrl-C" in st["reason"]

    # D: sbatch refused the job: the run failed with sbatch's error; the sweep still summed up
    assert pd.returncode == 1, out_d[-4000:]
    assert _json(refused / "summary.json")["counts"]["failed"] == 1
    st = _json(refused / "0" / "status.json")
    assert st["status"] == "failed" and "could not be submitted" in st["reason"] and "sbatch" in st["reason"], st

    # nothing left: no job in squeue (an ended job stays listed for MinJobAge=5 s), no process of the jobs
    deadline = time.time() + 20
    while slurm.jobs() and time.time() < deadline:
        time.sleep(1)
    assert not slurm.jobs(), subprocess.run(["squeue"], env=slurm.env, capture_output=True, text=True).stdout
    assert not processes_left(tag, wait_s=10)
    print(f"real SLURM sweeps: {elapsed:.0f} s")


def test_single_runs_submitted_from_a_machine_without_gpus(slurm, tmp_path):
    """``python -m bench hydra/launcher=slurm hardware=<profile> ...`` without --multirun, CUDA hidden: the run is
    planned here for the profile (a CPU node's, written by bench.probe), submitted, and checked again in the job
    on the node it landed on: this CPU's profile completes, another CPU's is refused there (invalid, exit 2)."""
    cfg = tmp_path / "conf"
    here, other = cfg / "hardware" / "this_node.yaml", cfg / "hardware" / "other_node.yaml"
    p = subprocess.run([sys.executable, "-m", "bench.probe", "--out", str(here), "--world-size", "1", "--quick"],
                       cwd=REPO, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = here.read_text().splitlines()
    this_cpu = next(ln.split(": ", 1)[1].strip("'") for ln in lines if ln.startswith("gpu: "))
    other.write_text("\n".join("gpu: 'CPU: another CPU (64 logical CPUs)'" if ln.startswith("gpu: ") else
                               "name: other_node" if ln.startswith("name: ") else ln for ln in lines) + "\n")
    env = {**slurm.env, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    procs = {}
    for name in ("this_node", "other_node"):
        args = [sys.executable, "-m", "bench", "--config-dir", str(cfg), "hydra/launcher=slurm", f"hardware={name}",
                *FAST, f"hydra.sweep.dir={tmp_path / name}"]
        with open(tmp_path / f"{name}.log", "w") as log:
            procs[name] = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        out = {name: _wait(procs[name], tmp_path / f"{name}.log", 240) for name in procs}
    finally:
        stop_all(list(procs.values()))
    st, m = _json(tmp_path / "this_node" / "0" / "status.json"), _json(tmp_path / "this_node" / "0" / "metrics.json")
    assert procs["this_node"].returncode == 0, out["this_node"][-4000:]
    assert st["status"] == m["status"] == "completed" and st["submitit_job_id"], (st, m.get("error"))
    assert m["config"]["submit"] == "slurm" and m["config"]["hardware"]["gpu"] == this_cpu
    assert m["memory"]["plan"]["device_memory_source"] == "hardware=this_node"
    assert procs["other_node"].returncode == 2, out["other_node"][-4000:]
    st = _json(tmp_path / "other_node" / "0" / "status.json")
    assert st["status"] == "invalid" and st["submitit_job_id"], st  # refused in the job, where it landed
    assert f"is CPU: another CPU (64 logical CPUs), but this run is on {this_cpu} (this job's node" in st["reason"]

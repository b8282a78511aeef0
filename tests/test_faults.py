"""The fault suite on CPU (gloo, real processes): nothing lost, nothing left behind.

Each test injects one fault into a real `python -m bench` command and checks the status it records,
that no result is lost or written over, and that no process of the command outlives it (every
process it starts carries a tag in its environment: tests.conftest.processes_left).  The hang past
run_timeout_s is tests/test_runs.py::test_hung_run_is_killed_by_run_timeout, the broken run folders
fed to the analysis are tests/test_analysis.py::test_broken_sweep_is_reported_not_fatal.
Each test adds a row to the fault table when $BENCH_FAULT_TABLE is set (tests/stress.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import CPU_FAST, REPO, fault_env, metrics_of, processes_left, rank_pid, record_fault

FAST = ["device=cpu", "precision=fp32", "warmup_steps=1"]
# sweep arms (a config folder on Hydra's search path, as in tests/test_sweeps.py)
CASES = {
    "q1": "defaults:\n  - override /strategy: single\nsteps: 3\nseed: 1\n",
    "q2": "defaults:\n  - override /strategy: single\nsteps: 3\nseed: 2\n",
    "q3": "defaults:\n  - override /strategy: single\nsteps: 3\nseed: 3\n",
    "d2": "defaults:\n  - override /strategy: ddp\nworld_size: 2\nsteps: 3\n",
    "slow": "defaults:\n  - override /strategy: ddp\nworld_size: 2\nsteps: 30\n",  # ~10 s of steps
}


@pytest.fixture
def conf(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fault_conf") / "conf"
    (d / "case").mkdir(parents=True)
    for name, body in CASES.items():
        (d / "case" / f"{name}.yaml").write_text("# @package _global_\n" + body)
    return d


def _bench(args: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                            **kw)


def _sweep_args(conf: Path, sweep: Path, cases: str, *extra: str) -> list[str]:
    return ["--multirun", f"hydra.searchpath=[file://{conf}]", f"+case={cases}", *FAST, f"hydra.sweep.dir={sweep}",
            *extra]


def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _says(path: Path, text: str) -> bool:
    return path.is_file() and text in path.read_text(errors="replace")


def _jobs(sweep: Path) -> dict[str, Path]:
    """case name -> its run folder, from the sweep's manifest."""
    man = json.loads((sweep / "sweep.json").read_text())
    return {next(o.split("=", 1)[1] for o in j["overrides"] if o.startswith("+case=")): sweep / j["dir"]
            for j in man["jobs"]}


def _status(d: Path) -> str | None:
    p = d / "status.json"
    return json.loads(p.read_text())["status"] if p.is_file() else None


def _stamps(d: Path) -> dict[str, int]:
    return {str(p.relative_to(d)): p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}


def _run_folders_by_key(sweep: Path) -> dict[str, list[str]]:
    """run key -> the folders where a run of it started (Hydra wrote .hydra/ there), attempts included."""
    out: dict[str, list[str]] = {}
    for hydra in sweep.rglob(".hydra"):
        d = hydra.parent
        st = json.loads((d / "status.json").read_text()) if (d / "status.json").is_file() else {}
        out.setdefault(st.get("key"), []).append(str(d.relative_to(sweep)))
    return out


# ------------------------------------------------------------------------------ kill -9 one rank
def test_kill_9_of_one_rank_mid_run_is_recorded_as_its_failure(tmp_path):
    """SIGKILL to rank 1 mid-run: the run ends at once, status failed, the error names rank 1 and
    the signal (not rank 0's collateral "Connection reset by peer"), and no process is left."""
    d, env = tmp_path / "run", fault_env()
    t0 = time.time()
    p = _bench([*FAST, "steps=200", "strategy=ddp", "world_size=2", "run_timeout_s=240", f"hydra.run.dir={d}"], env)
    try:
        _wait_for(lambda: _says(d / "rank1.log", "setup done"), 180, "rank 1 to start training")
        time.sleep(1.5)  # in the timed steps
        pid = rank_pid(env, d, 1)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, out[-3000:]
    m = metrics_of(d)
    left = processes_left(env)
    lost = 0 if m["status"] in ("failed", "oom", "timeout") else 1  # the run's record
    record_fault("kill -9 of one rank mid-run (ddp, 2 ranks)", m["status"], lost, len(left),
                 m["error"]["message"])
    assert m["status"] == "failed" and _status(d) == "failed"
    assert m["error"]["rank"] == 1 and m["error"]["type"] == "KilledBySignal", m["error"]
    # the signal, where the launcher saw rank 1 die; else rank 0's lost connection names it
    assert "signal 9 (SIGKILL)" in m["error"]["message"] or "ended without recording" in m["error"]["message"]
    assert not left, left
    assert time.time() - t0 < 200


# ------------------------------------------------------------------------------ Ctrl-C, then resume
def test_ctrl_c_mid_sweep_then_resume_completes_every_run(tmp_path, conf):
    """SIGINT (to the process group, as a terminal sends it) during the second of three runs: exit
    130, the first run's result kept, the second interrupted, the third pending, no process left;
    resume=true then runs the interrupted and the pending one, leaves the first untouched, and every
    run of the sweep ends completed."""
    sweep, env = tmp_path / "sweep", fault_env()
    args = _sweep_args(conf, sweep, "q1,slow,q2")
    p = _bench(args, env, start_new_session=True)
    try:
        def slow_started():
            runs = [x for x in sweep.iterdir() if x.is_dir()] if sweep.is_dir() else []
            return any(_says(x / "rank1.log", "setup done") for x in runs)
        _wait_for(slow_started, 240, "the second run to start training")
        time.sleep(1.0)
        os.killpg(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    left = processes_left(env)
    jobs = _jobs(sweep)
    assert p.returncode == 130, out[-3000:]
    assert [_status(jobs[c]) for c in ("q1", "slow", "q2")] == ["completed", "interrupted", "pending"], out[-3000:]
    assert not left, left
    first = _stamps(jobs["q1"])

    env2 = fault_env()
    p2 = _bench(_sweep_args(conf, sweep, "q1,slow,q2", "resume=true"), env2)
    out2, _ = p2.communicate(timeout=600)
    left += processes_left(env2)
    jobs2 = _jobs(sweep)
    statuses = {c: _status(jobs2[c]) for c in ("q1", "slow", "q2")}
    lost = sum(s != "completed" for s in statuses.values()) + (_stamps(jobs["q1"]) != first)
    record_fault("SIGINT to a sweep mid-run, then resume=true", "interrupted, then completed", lost, len(left),
                 "the interrupted run is run again by resume=true, its attempt kept in .attempts/")
    assert p2.returncode == 0, out2[-3000:]
    assert "2 to run, 0 invalid" in out2 and "1 resumed" in out2, out2[-3000:]
    assert statuses == {"q1": "completed", "slow": "completed", "q2": "completed"}, out2[-3000:]
    assert _stamps(jobs["q1"]) == first  # the completed result: not a file touched
    assert jobs2["slow"] == jobs["slow"] and (jobs["slow"] / ".attempts" / "1" / "status.json").is_file()
    assert not left, left


# ------------------------------------------------------------------------------ two sweeps on one folder
@pytest.mark.slow
def test_two_resuming_sweeps_on_one_folder_run_each_job_once(tmp_path, conf):
    """Two sweeps started at once on one hydra.sweep.dir with resume=true (after a first sweep
    completed q1): every job runs exactly once (the two share the work, each waits for the other's
    runs), q1's result is untouched, every run ends completed, no claim and no process is left."""
    sweep = tmp_path / "sweep"
    env0 = fault_env()
    p0 = _bench(_sweep_args(conf, sweep, "q1"), env0)
    out0, _ = p0.communicate(timeout=300)
    assert p0.returncode == 0, out0[-3000:]
    q1 = _stamps(_jobs(sweep)["q1"])

    cases = "q1,q2,q3,d2"
    envs = [fault_env(), fault_env()]
    procs = [_bench(_sweep_args(conf, sweep, cases, "resume=true"), e) for e in envs]
    outs = [None, None]

    def collect(i):
        outs[i] = procs[i].communicate(timeout=900)[0]
    threads = [threading.Thread(target=collect, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    left = [x for e in envs for x in processes_left(e)]
    by_key = _run_folders_by_key(sweep)
    jobs = _jobs(sweep)
    statuses = {c: _status(jobs[c]) for c in cases.split(",")}
    twice = {k: v for k, v in by_key.items() if len(v) > 1}
    lost = sum(s != "completed" for s in statuses.values()) + (_stamps(jobs["q1"]) != q1)
    record_fault("two sweeps with resume=true on one sweep dir at once", "completed (each job once)", lost,
                 len(left), f"runs done twice: {len(twice)}")
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    assert statuses == dict.fromkeys(statuses, "completed"), (statuses, outs[0][-2000:], outs[1][-2000:])
    assert not twice, twice  # no job run twice
    assert len(by_key) == 4  # q1 (the first sweep) and q2, q3, d2: one run each
    assert _stamps(jobs["q1"]) == q1
    assert not list((sweep / ".claims").glob("*.json"))  # every claim released
    assert not list(sweep.rglob(".attempts"))  # neither moved the other's run aside
    assert not left, left
    # each sweep's summary reports all four runs completed, the other's runs as resumed
    for out in outs:
        assert "SUMMARY 4 runs: completed=4" in out, out[-3000:]


# ------------------------------------------------------------------------------ unwritable output folder
@pytest.mark.parametrize("where", ["file_as_parent", "proc", "sweep_under_file"])
def test_unwritable_output_folder_is_refused_before_launch(tmp_path, where):
    """An output folder that cannot be created or written: one line naming it, exit code 2, in a
    second or so - no rank started, nothing else written."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    env = fault_env()
    if where == "file_as_parent":
        folder, args = blocker / "run", [*CPU_FAST, "strategy=ddp", "world_size=2", f"hydra.run.dir={blocker / 'run'}"]
    elif where == "proc":
        folder, args = Path("/proc/bench_no_such_dir"), [*CPU_FAST, "hydra.run.dir=/proc/bench_no_such_dir"]
    else:
        folder = blocker / "sweep"
        args = ["--multirun", *CPU_FAST, "strategy=single,ddp", f"hydra.sweep.dir={folder}"]
    t0 = time.time()
    p = _bench(args, env)
    out, _ = p.communicate(timeout=120)
    left = processes_left(env)
    record_fault(f"unwritable output folder ({where})", f"refused, exit {p.returncode}", 0, len(left),
                 out.strip().splitlines()[-1] if out.strip() else "")
    assert p.returncode == 2, out[-3000:]
    lines = out.strip().splitlines()
    assert len(lines) == 1 and f"cannot write the output folder {folder}" in lines[0], out[-3000:]
    assert "Traceback" not in out and "[sweep]" not in out
    assert blocker.read_text() == "not a folder"
    assert time.time() - t0 < 60 and not left, left

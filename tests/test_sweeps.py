"""Sweeps end to end on CPU (real processes, bench/sweep/): failure isolation, statuses, summary,
exit code, resume, rerun_failed, Ctrl-C.  The test's own sweep arms come from a config folder
added to Hydra's search path, so one sweep holds exactly the runs we want."""
from __future__ import annotations

import json
import statistics
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

FAST = ["device=cpu", "precision=fp32", "steps=3", "warmup_steps=1"]

# one sweep = these five runs (+case=<name>)
CASES = {
    "ok_single": "defaults:\n  - override /strategy: single\n",
    "oom": "defaults:\n  - override /strategy: single\nfault: {kind: oom, rank: 0, step: 1}\n",
    "hang": "defaults:\n  - override /strategy: ddp\nworld_size: 2\nfault: {kind: hang, rank: 0, step: 1}\n"
            "run_timeout_s: 20\n",
    "invalid": "defaults:\n  - override /strategy: single\nworld_size: 2\n",
    "ok_ddp": "defaults:\n  - override /strategy: ddp\nworld_size: 2\n",
}
EXPECTED = {"ok_single": "completed", "oom": "oom", "hang": "timeout", "invalid": "invalid", "ok_ddp": "completed"}


def _conf(tmp: Path) -> Path:
    d = tmp / "conf"
    (d / "case").mkdir(parents=True)
    for name, body in CASES.items():
        (d / "case" / f"{name}.yaml").write_text("# @package _global_\n" + body)
    return d


def _sweep(conf: Path, sweep: Path, *extra: str, cases=tuple(CASES), timeout=300, **kw):
    args = [sys.executable, "-m", "bench", "--multirun", f"hydra.searchpath=[file://{conf}]",
            f"+case={','.join(cases)}", *FAST, f"hydra.sweep.dir={sweep}", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env, **kw)


def _jobs(sweep: Path) -> dict[str, dict]:
    """case name -> {dir, status.json, metrics.json} from the sweep manifest."""
    man = json.loads((sweep / "sweep.json").read_text())
    out = {}
    for j in man["jobs"]:
        case = next(o.split("=", 1)[1] for o in j["overrides"] if o.startswith("+case="))
        d = sweep / j["dir"]
        out[case] = {"dir": d, "job": j, "status": json.loads((d / "status.json").read_text()),
                     "metrics": json.loads((d / "metrics.json").read_text())}
    return out


def _stamps(d: Path) -> dict[str, int]:
    """mtime of every file of a run folder (rank files, results, Hydra's files, logs)."""
    return {str(p.relative_to(d)): p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def conf_dir(tmp_path_factory):
    return _conf(tmp_path_factory.mktemp("conf"))


@pytest.fixture(scope="module")
def first_sweep(tmp_path_factory, conf_dir):
    conf, sweep = conf_dir, tmp_path_factory.mktemp("sweep") / "multirun"
    t0 = time.time()
    p = _sweep(conf, sweep)
    return conf, sweep, p, time.time() - t0


def test_sweep_isolates_failures_and_reports_them(first_sweep):
    conf, sweep, p, elapsed = first_sweep
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-4000:]  # an oom and a timeout fail the sweep; the invalid one does not
    jobs = _jobs(sweep)
    assert {c: j["status"]["status"] for c, j in jobs.items()} == EXPECTED, out[-4000:]
    for c, j in jobs.items():
        assert j["metrics"]["status"] == EXPECTED[c]
        # the run key is the same in status.json and metrics.json, and differs between configurations
        assert j["status"]["key"] == j["metrics"]["job"]["key"] == j["job"]["key"]
    assert len({j["status"]["key"] for j in jobs.values()}) == len(jobs)
    # invalid: recorded with its reason, no process started
    inv = jobs["invalid"]
    assert inv["metrics"]["error"]["type"] == "ConfigError" and inv["metrics"]["error"]["key"] == "world_size"
    assert "strategy=single" in inv["status"]["reason"] and not list(inv["dir"].glob("rank*"))
    # the timeout reaped both ranks quickly; the oom is classified from rank 0's own record
    assert "run_timeout_s=20" in jobs["hang"]["metrics"]["error"]["message"]
    assert jobs["hang"]["status"]["wall_s"] < 60
    assert jobs["oom"]["metrics"]["error"]["rank"] == 0
    # completed runs record wall time and fixed overhead (launch -> first step, last step -> done)
    for c in ("ok_single", "ok_ddp"):
        st = jobs[c]["status"]
        assert 0 < st["startup_s"] < st["wall_s"] and 0 <= st["teardown_s"] < st["wall_s"]
        assert st["overhead_s"] == pytest.approx(st["startup_s"] + st["teardown_s"])
        assert jobs[c]["metrics"]["job"]["overhead_s"] == pytest.approx(st["overhead_s"])
        # the time outside the steps adds what the warm-up took beyond its steps (rank 0's own record)
        r0 = json.loads((jobs[c]["dir"] / "rank0.json").read_text())
        beyond = r0["warmup_s"] - (len(r0["losses"]) - len(r0["step_times"])) * statistics.median(r0["step_times"])
        assert st["outside_steps_s"] == pytest.approx(st["overhead_s"] + max(0.0, beyond))
    assert len(jobs["ok_ddp"]["metrics"]["ranks"]) == 2
    # the sweep's fork server imported torch._dynamo once, for every run's ranks
    for c in ("ok_single", "ok_ddp"):
        assert [r["preloaded_modules"] for r in jobs[c]["metrics"]["ranks"]] == [["torch._dynamo"]] * len(
            jobs[c]["metrics"]["ranks"])
    # summary: printed and in summary.json
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["counts"] == {"completed": 2, "invalid": 1, "skipped": 0, "failed": 0, "oom": 1, "timeout": 1,
                                 "interrupted": 0, "pending": 0, "unknown": 0}
    assert summary["exit_code"] == 1
    assert "SUMMARY 5 runs: completed=2 invalid=1 skipped=0 failed=0 oom=1 timeout=1 interrupted=0" in out
    # the device time the runs held, from each run's own status.json (wall x world size), and its overhead share
    held = [j["status"] for j in jobs.values() if j["status"].get("wall_s")]
    g = summary["gpu_time"]
    assert g["runs"] == len(held) >= 3
    assert g["device_minutes"] == pytest.approx(sum(h["wall_s"] * h["world_size"] for h in held) / 60, abs=0.01)
    assert 0 < g["overhead_minutes"] < g["device_minutes"] and "[sweep] device time: " in out
    # progress: the plan, one line per run, the live step line with tokens/s; no carriage returns
    assert "[sweep] 5 runs in" in out and "4 to run, 1 invalid" in out
    assert "[sweep] run 4/4" in out and "tokens/s so far" in out and "\r" not in out
    print(f"first sweep: {elapsed:.1f} s")


@pytest.mark.slow
def test_resume_runs_nothing_new_and_rerun_failed_only_the_failed(first_sweep):
    conf, sweep, _, _ = first_sweep
    jobs = _jobs(sweep)
    before = {c: _stamps(j["dir"]) for c, j in jobs.items()}

    p = _sweep(conf, sweep, "resume=true")
    out = p.stdout + p.stderr
    assert "0 to run, 0 invalid and 0 predicted not to fit (recorded without running), 5 resumed" in out, out[-3000:]
    assert {c: _stamps(j["dir"]) for c, j in jobs.items()} == before  # not a file touched
    assert p.returncode == 1  # the sweep still holds an oom and a timeout
    assert json.loads((sweep / "summary.json").read_text())["resumed"] == 5
    # the cost guard estimates from the earlier results of the same model/strategy/world size
    p = _sweep(conf, sweep, "resume=true", "rerun_failed=true", "hydra.sweeper.dry_run=true")
    assert p.returncode == 0 and "2 to run" in p.stdout + p.stderr
    assert "estimate from earlier results" in p.stdout + p.stderr

    p = _sweep(conf, sweep, "resume=true", "rerun_failed=true")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "2 to run, 0 invalid and 0 predicted not to fit (recorded without running), 3 resumed" in out
    after = {c: _stamps(j["dir"]) for c, j in jobs.items()}
    for c in ("ok_single", "ok_ddp", "invalid"):
        assert after[c] == before[c], c  # completed and invalid results untouched
    jobs2 = _jobs(sweep)
    for c in ("oom", "hang"):
        d = jobs[c]["dir"]
        assert jobs2[c]["dir"] == d  # re-run in place ...
        assert (d / ".attempts" / "1" / "status.json").exists()  # ... the earlier attempt kept aside
        assert jobs2[c]["status"]["status"] == EXPECTED[c]
        assert jobs2[c]["status"]["t_start"] > jobs[c]["status"]["t_start"]


def test_completed_result_is_never_overwritten_and_ctrl_c_stops_the_sweep(tmp_path, conf_dir):
    conf = conf_dir
    sweep = tmp_path / "multirun"
    # a completed run in folder 0 ...
    p = _sweep(conf, sweep, cases=("ok_single",))
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    done = _stamps(sweep / "0")
    # ... then another sweep into the same folder, whose job 0 is another configuration (a hang)
    # interrupted by Ctrl-C (SIGINT to the process group, as a terminal sends it)
    args = [sys.executable, "-m", "bench", "--multirun", f"hydra.searchpath=[file://{conf}]",
            "+case=hang,ok_single", *FAST, "run_timeout_s=600", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    hang_dir = None
    deadline = time.time() + 120
    while time.time() < deadline:
        cands = [d for d in sweep.iterdir() if d.name.startswith("0_") and (d / "rank0.log").exists()]
        if cands and "step" not in (cands[0] / "rank0.log").read_text() and \
                "setup done" in (cands[0] / "rank0.log").read_text():
            hang_dir = cands[0]
            break
        time.sleep(0.5)
    assert hang_dir is not None
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-3000:]
    assert _stamps(sweep / "0") == done  # the completed result of another configuration: untouched
    st = json.loads((hang_dir / "status.json").read_text())
    assert st["status"] == "interrupted" and json.loads((hang_dir / "metrics.json").read_text())["status"] == \
        "interrupted"
    man = json.loads((sweep / "sweep.json").read_text())
    second = sweep / man["jobs"][1]["dir"]
    assert json.loads((second / "status.json").read_text())["status"] == "pending"  # never started
    assert "interrupted=1 not_run=1" in out
    # no process of the run is left behind (one in its last moments of exiting, "[python]", may take a few
    # seconds on a loaded machine: waited for, not counted)
    deadline = time.time() + 15
    while True:
        ps = subprocess.run(["ps", "-eo", "pid,pgid,stat,args"], capture_output=True, text=True).stdout
        alive = [line for line in ps.splitlines()
                 if line.split()[1:2] == [str(proc.pid)] and not line.split()[2].startswith("Z")]
        if not alive or time.time() > deadline:
            break
        time.sleep(0.5)
    assert not alive, ps


RECORDED = json.loads((REPO / "tests" / "data" / "recorded_runs.json").read_text())


def test_recorded_runs_keep_their_key():
    """resume=true matches runs by key, so today's run_key must hash the resolved configuration of a
    run recorded by an older bench (tests/data/recorded_runs.json: 100+ GPU runs, their config and
    key) to the key it was recorded with: knobs added since (``added=True`` in the schema) leave the
    key unchanged at their defaults, and change it at any other value."""
    from bench.run.runs import _added, _sections, run_key, with_added_defaults

    changed = 0
    for rec in RECORDED:
        cfg = rec["config"]
        assert run_key(cfg) == rec["key"], rec["run"]
        today = with_added_defaults(cfg)  # what composing its overrides today resolves to
        assert run_key(today) == rec["key"], rec["run"]
        for section, schema in _sections(today):
            for knob, default in _added(schema).items():
                parent = today[section] if section else today
                now = parent[knob]
                other = {**parent, knob: (not now) if isinstance(now, bool) else f"not-{now}"}
                moved = {**today, section: other} if section else other
                assert run_key(moved) != rec["key"], (rec["run"], knob)
                changed += 1
    assert changed > len(RECORDED)  # the check above ran (there are added knobs)




def _numeric_looking(name: str) -> bool:
    """Whether Hydra's override parser reads ``x=<name>`` as a number (``1_67436339`` is the int 167436339)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return not isinstance(OverridesParser.create().parse_override(f"x={name}").value(), str)


def test_subdir_override_keeps_folder_names_that_look_like_numbers():
    """A run folder ``<num>_<key[:8]>`` whose key starts with 8 digits (``1_67436339``: Python's digit
    separator) or digits and an ``e`` (``1_6743e339``: a float, inf) reaches Hydra as that name."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from bench.sweep.jobs import subdir_override

    parser = OverridesParser.create()
    for name in ("0", "12", "1_67436339", "1_6743e339", "1_67436339_2", "0_dc66ba16", "3_0e000000"):
        o = parser.parse_override(subdir_override(name))
        assert o.key_or_group == "hydra.sweep.subdir" and o.value() == name, name


def test_resumed_sweep_reports_the_status_of_a_run_in_a_numeric_looking_folder(tmp_path, conf_dir):
    """Two different sweeps into one folder (resume=true): the second one's job #1 is another configuration
    than the first one's, so it runs into ``1_<key[:8]>``; chosen here so that the name looks like a
    number to Hydra (observed on a GPU host: the run went into ``167436339/``, the sweep read the pending
    status of ``1_67436339/`` and counted a completed run not_run).  Every status the sweep reports (the
    ``ended`` line, summary.json) is the one in the run folder's metrics.json."""
    from bench.run.runs import run_key

    sweep, dry = tmp_path / "multirun", tmp_path / "dry"
    # which seed gives such a key: the sweeper's own plan of one job (a dry run records its configuration and key),
    # then that configuration's key at other seeds (the sweep below checks the folder it really gets)
    p = _sweep(conf_dir, dry, "seed=2", "hydra.sweeper.dry_run=true", cases=("ok_single",))
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    job = json.loads((dry / "plans.json").read_text())[0]
    assert run_key(job["config"]) == job["key"]
    seeds = [n for n in range(2, 2000) if _numeric_looking(f"1_{run_key({**job['config'], 'seed': n})[:8]}")]
    assert seeds, "no seed in 2..1999 whose run key starts like a number"
    p = _sweep(conf_dir, sweep, "seed=0,1", cases=("ok_single",))
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    p = _sweep(conf_dir, sweep, f"seed=0,{seeds[0]}", "resume=true", cases=("ok_single",))
    out = p.stdout + p.stderr
    assert "1 to run, 0 invalid and 0 predicted not to fit (recorded without running), 1 resumed" in out, out[-3000:]
    man = json.loads((sweep / "sweep.json").read_text())
    dirs = {j["num"]: j["dir"] for j in man["jobs"]}
    assert dirs[0] == "0" and dirs[1].startswith("1_") and _numeric_looking(dirs[1]), dirs
    metrics = {n: (json.loads((sweep / d / "metrics.json").read_text())["status"]
                   if (sweep / d / "metrics.json").exists() else "no metrics.json") for n, d in dirs.items()}
    assert metrics == {0: "completed", 1: "completed"}, (sorted(p.name for p in sweep.iterdir()), out[-3000:])
    ended = {int(n): s for n, s in re.findall(r"\[sweep\] run \d+/\d+ \(job #(\d+)\) ended (\S+)", out)}
    assert ended == {1: "completed"}, out[-3000:]
    assert "not into its planned folder" not in out
    summary = json.loads((sweep / "summary.json").read_text())
    assert {r["num"]: r["status"] for r in summary["rows"]} == metrics
    assert summary["counts"]["completed"] == 2 and summary["counts"]["pending"] == 0 and p.returncode == 0
    assert "SUMMARY 2 runs: completed=2" in out
    # no run folder outside the plan (the run went into the folder the sweep planned and reads)
    assert sorted(d.name for d in sweep.iterdir() if d.is_dir() and not d.name.startswith(".")) == ["0", "1", dirs[1]]

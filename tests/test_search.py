"""The knob search (bench/sweep/search.py, ``+experiment=tune``, ``hydra/sweeper=knob_search``) end to end on CPU: 2 gloo DDP ranks on the
tiny model.  Its timings mean nothing here; its mechanics are what is tested: the candidates, successive
halving (a rung's best third runs again, longer), the GPU-time budget that stops it, resuming an
interrupted search, tune.json's winner as a command line, and the analysis' default vs best."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bench.jsonio import read_json_dict
from tests.conftest import REPO, fault_env, processes_left, run_bench

# compile=false and the micro-batch on the command line: a knob the command line sets is not searched (nor
# compile_mode, whose candidates need compile=true), so the search is default vs strategy.bucket_cap_mb=100
SEARCH = ("+experiment=tune", "strategy=ddp", "world_size=2", "compile=false", "strategy.micro_batch_size=null",
          "device=cpu", "precision=fp32", "hydra.sweeper.rungs=[[1,2],[1,3]]")


def _tune(sweep) -> dict:
    return json.loads((sweep / "tune.json").read_text())


def _statuses(sweep) -> dict[str, str]:
    return {d.name: json.loads((d / "status.json").read_text())["status"]
            for d in sweep.iterdir() if (d / "status.json").is_file()}


def _stamps(sweep) -> dict[str, int]:
    return {d.name: (d / "metrics.json").stat().st_mtime_ns for d in sweep.iterdir() if (d / "metrics.json").is_file()}


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """The search of SEARCH, stopped by its GPU-time budget after its first run, then resumed to its end: the first
    command's output, statuses and metrics.json times (for test_budget_stops_the_search_and_resume_goes_on), then
    (sweep folder, the resumed search's output), which the other tests read: the resumed command plans and runs the
    whole search (rung 0 again, the completed trial reused, then rung 1), prints it and records its winner."""
    sweep = tmp_path_factory.mktemp("search") / "sweep"
    env = {"BENCH_BESTS": str(sweep.parent / "bests.json")}
    # a budget of 0.001 GPU-minutes: the first run starts (nothing spent yet), none after it
    p = run_bench(*SEARCH, "hydra.sweeper.budget_min=0.001", run_dir=sweep, multirun=True, timeout=600, env=env)
    st = _statuses(sweep)
    stopped = {"returncode": p.returncode, "out": p.stdout + p.stderr, "statuses": st, "stamps": _stamps(sweep),
               "reasons": {d: json.loads((sweep / d / "status.json").read_text()).get("reason") for d in st}}
    p = run_bench(*SEARCH, "resume=true", run_dir=sweep, multirun=True, timeout=600, env=env)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return sweep, p.stdout + p.stderr, stopped


def test_search_halves_the_candidates_and_names_a_winner(searched):
    sweep, out, _ = searched
    base = _tune(sweep)["bases"][0]
    trials = {t["name"]: t for t in base["trials"]}
    # bucket_cap_mb=25 is the default: the same run key, one trial
    assert set(trials) == {"default", "strategy.bucket_cap_mb=25.0", "strategy.bucket_cap_mb=100.0"}
    assert trials["strategy.bucket_cap_mb=25.0"]["duplicate_of"] == "default"
    ran = [t for t in trials.values() if "duplicate_of" not in t]
    assert all(t["status"] == "completed" and t["tokens_per_s"] > 0 for t in ran)
    # rung 0: both; rung 1 (longer, the last): only the faster one (keep = a third, at least one), twice
    assert sorted(t["rung"] for t in ran) == [0, 1]
    assert "[tune] rung 0: 2 trial(s) at 1 warm-up + 2 timed steps" in out
    assert "[tune] rung 1: 1 trial(s) at 1 warm-up + 3 timed steps, 2 runs each (the median decides)" in out
    last = next(t for t in ran if t["rung"] == 1)["measured"]["1"]
    assert last["runs"] == 2 and len(set(last["dirs"])) == 2
    seeds = sorted(json.loads((sweep / d / "metrics.json").read_text())["config"]["seed"] for d in last["dirs"])
    assert seeds == [0, 1]  # a repeat is the same setting with the next seed
    w = base["winner"]
    assert w["rung"] == 1 and w["name"] in trials and w["tokens_per_s"] > 0 and w["median_step_tokens_per_s"] > 0
    # the survivor keeps both measurements, the other only rung 0's
    assert sorted(len(t["measured"]) for t in ran) == [1, 2]
    # the winner as the command that runs it once: no search preset, rung lengths, resume or hydra folders
    assert base["command"].startswith("python -m bench ") and "strategy=ddp" in base["command"]
    for word in ("+experiment=tune", "warmup_steps", "steps=", "resume", "hydra."):
        assert word not in base["command"], base["command"]
    assert sorted(_statuses(sweep).values()) == ["completed"] * 4, _statuses(sweep)


def test_the_winner_goes_into_the_store_of_measured_bests(searched):
    """The search's winner becomes an entry of the user's store (BENCH_BESTS): strategy, the knob values where
    it differs from the base, tokens/s, peak memory and the workload (on CPU the device is "cpu")."""
    sweep, out, _ = searched
    base = _tune(sweep)["bases"][0]
    entries = json.loads((sweep.parent / "bests.json").read_text())["entries"]
    assert len(entries) == 1 and "1 winner(s) recorded in the store of measured bests" in out
    e, w = entries[0], base["winner"]
    assert e["strategy"]["name"] == "ddp" and e["tokens_per_s"] == w["tokens_per_s"] and e["peak_memory_mb"] > 0
    assert e["settings"] == ({} if w["name"] == "default" else {"strategy.bucket_cap_mb": 100.0})
    assert e["workload"] == {"device": "cpu", "model": "tiny", "arch": "gpt", "parameters": e["workload"]["parameters"],
                             "world_size": 2, "tokens_per_microbatch": 4 * 128, "precision": "fp32"}
    assert e["source"] == str(sweep / "tune.json") and e["command"] == base["command"]


def test_analysis_of_a_search_shows_default_beside_best(searched, tmp_path):
    sweep, _, _ = searched
    p = subprocess.run([sys.executable, "-m", "multirun_analysis", str(sweep), "--no-plots", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    md = (tmp_path / "report.md").read_text()
    assert "## Each strategy at its defaults and at its best" in md and "python -m bench " in md
    # rung 1 re-measured one setting for longer: still one strategy, one row, its longer measurement
    table = md.split("## Each strategy at its defaults and at its best")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| tiny ")]
    cells = [c.strip() for c in rows[0].strip().strip("|").split("|")]
    assert len(rows) == 1 and "| ddp |" in rows[0] and cells[-2] == "2", table  # settings run (then: not to trust)
    answer = md.split("```bash")[1].split("```")[0]
    assert "+experiment=tune" not in answer and "steps=" not in answer, answer
    # the report's best is tune.json's winner (both: the fastest at the longest measurement)
    assert sorted(answer.split()) == sorted(_tune(sweep)["bases"][0]["command"].split()), answer
    assert "3 timed steps x 2 run(s)" in rows[0], rows[0]


def _trial(name, status, **measured):
    return {"name": name, "rung": max((int(r[1:]) for r in measured), default=0), "status": status,
            "measured": {r[1:]: {"tokens_per_s": v, "median_step_tokens_per_s": v, "dir": name}
                         for r, v in measured.items()}}


def test_winner_is_the_fastest_at_the_deepest_rung_measured():
    from bench.sweep.search import unmeasured_survivors, winner
    # rung 1 ran both survivors: the faster there wins, though it was slower at rung 0
    a, b = _trial("a", "completed", r0=100, r1=90), _trial("b", "completed", r0=95, r1=99)
    assert winner([a, b, _trial("c", "completed", r0=50)]) == (b, 1)
    # the budget left b pending at rung 1: its one short rung-0 run is not ranked against a's rung 1
    b_cut = {**_trial("b", "pending", r0=105), "rung": 1}
    assert winner([a, b_cut, _trial("c", "completed", r0=50)]) == (a, 1)
    assert unmeasured_survivors([a, b_cut], 1) == ["b"]  # tune.json names it: the winner was not compared with b
    # a survivor that failed at rung 1 is out of it, not a reason to fall back
    b_oom = {**_trial("b", "oom", r0=105), "rung": 1}
    assert winner([a, b_oom]) == (a, 1)
    assert unmeasured_survivors([a, b_oom], 1) == []  # it ended there: nothing left to compare with
    # rung 0 itself cut short: the fastest of what ran
    assert winner([_trial("c", "completed", r0=50), {**_trial("d", "pending"), "measured": {}}])[0]["name"] == "c"
    assert winner([{"name": "e", "rung": 0, "status": "invalid"}]) == (None, None)
    # the winner is the report's: by timed-window tokens/s, though the median step ranks the other first
    f = {**_trial("f", "completed", r0=100, r1=100)}
    f["measured"]["1"]["median_step_tokens_per_s"] = 120
    g = _trial("g", "completed", r0=100, r1=110)
    assert winner([f, g]) == (g, 1)


def test_rungs_must_time_more_steps_each(tmp_path):
    p = run_bench(*SEARCH[:-1], "hydra.sweeper.rungs=[[1,3],[2,3]]", run_dir=tmp_path / "sweep", multirun=True,
                  timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "hydra.sweeper.rungs" in out and "must exceed the rung before" in out, out[-2000:]
    assert not list((tmp_path / "sweep").glob("*/metrics.json"))  # refused before any run


@pytest.mark.parametrize("budget", ["0", "-1"])
def test_a_budget_of_no_gpu_minutes_is_refused_before_any_run(tmp_path, budget):
    """A budget of 0 or less would leave every trial pending and exit 0, as if the search had run."""
    p = run_bench(*SEARCH, f"hydra.sweeper.budget_min={budget}", run_dir=tmp_path / "sweep", multirun=True,
                  timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-2000:]
    assert f"hydra.sweeper.budget_min={budget}: must be > 0 GPU-minutes" in out, out[-2000:]
    assert not list((tmp_path / "sweep").glob("*/status.json"))  # refused before anything was planned


@pytest.mark.slow
def test_budget_stops_the_search_and_resume_goes_on(searched):
    """The budget stopped the search after its first run (the other trial of rung 0 pending, for the budget); the
    resumed search reused the completed trial, ran the pending one, then rung 1 (twice)."""
    sweep, _, stopped = searched
    assert stopped["returncode"] == 0, stopped["out"][-3000:]
    out = stopped["out"]
    assert "the search's budget is spent" in out and "hydra.sweeper.budget_min=0.001" in out
    st = stopped["statuses"]
    assert sorted(st.values()) == ["completed", "pending"], st
    pending = next(d for d, s in st.items() if s == "pending")
    assert "budget" in stopped["reasons"][pending]
    first = stopped["stamps"]

    st = _statuses(sweep)  # after resume=true
    assert sorted(st.values()) == ["completed"] * 4, st  # the pending trial ran, then rung 1 (twice)
    assert {d: t for d, t in _stamps(sweep).items() if d in first} == first  # the completed trial was reused
    assert _tune(sweep)["bases"][0]["winner"]["rung"] == 1


def test_the_profile_is_a_candidate_where_it_changes_something(tmp_path):
    """DDP's profile (compiled CUDA graphs) was measured on one rank: a candidate at world_size=1, where
    compile=true applies on CPU, and none at 2 ranks, where it applies nothing (the first test's trials)."""
    p = run_bench("+experiment=tune", "strategy=ddp", "world_size=1", "device=cpu", "precision=fp32", "dry_run=true",
                  run_dir=tmp_path / "sweep", multirun=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "precision=fp32 dry_run=True tuning=best warmup_steps=4 steps=10: run" in out, out[-3000:]


# ------------------------------------------------------------------------------ a strategy identity per base
# every ZeRO knob set on the command line: each base is its default alone, and the dry run plans in seconds
ZERO_DRY = ("+experiment=tune", "strategy=zero", "world_size=2", "device=cpu", "precision=fp32", "dry_run=true",
            "compile=false", "strategy.micro_batch_size=null", "strategy.autocast=false",
            "strategy.reduce_bucket_size=5e8", "strategy.overlap_comm=null", "strategy.compute_grad_norm=true",
            "strategy.leaf_blocks=false")


@pytest.mark.parametrize("stage", [None, "zero_stage=3"])
def test_zero_searches_each_stage_as_a_base_of_its_own_unless_the_stage_is_set(tmp_path, stage):
    """ZeRO's stage is part of its identity (StrategySpec.search_bases), not a knob: strategy=zero without a stage is
    four bases (ZeRO-0 to ZeRO-3, each with its own trials and winner); a stage the command line sets is the one."""
    sweep = tmp_path / "sweep"
    p = run_bench(*ZERO_DRY, *([stage] if stage else []), run_dir=sweep, multirun=True, timeout=120,
                  env={"BENCH_BESTS": str(tmp_path / "bests.json")})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    bases = _tune(sweep)["bases"]
    planned = json.loads((sweep / "plans.json").read_text())
    stages = sorted(j["config"]["strategy"]["zero_stage"] for j in planned)
    if stage is None:
        assert [b["base"][-1] for b in bases] == [f"strategy.zero_stage={i}" for i in range(4)]
        assert all(t["overrides"][:len(b["base"])] == b["base"] for b in bases for t in b["trials"])
        assert stages == [0, 1, 2, 3], stages
        assert "[tune] searched as bases of their own" in out and "-> 4 bases, strategy.zero_stage=0,1,2,3" in out
        from multirun_analysis.prediction import planned as planned_table  # the dry run's ranking names each stage

        assert set(planned_table([sweep])["strategy"]) == {"zero-0", "zero-1", "zero-2", "zero-3"}
    else:
        assert len(bases) == 1 and "strategy.zero_stage=3" not in bases[0]["base"] and stages == [3]
        assert "searched as bases of their own" not in out


def test_a_base_is_expanded_only_where_it_leaves_the_key_unset():
    from bench.sweep.search import per_identity, set_keys

    zero, ddp = {"strategy": {"name": "zero"}}, {"strategy": {"name": "ddp"}}
    bases, grid = per_identity(["strategy=zero", "model=tiny"], zero)
    assert bases == [["strategy=zero", "model=tiny", f"strategy.zero_stage={i}"] for i in range(4)]
    assert grid == {"strategy.zero_stage": (0, 1, 2, 3)}
    for given in ("zero_stage=2", "strategy.zero_stage=2", "+strategy.zero_stage=2"):
        assert "strategy.zero_stage" in set_keys(["strategy=zero", given])  # the shorthand counts as its key
        assert per_identity(["strategy=zero", given], zero) == ([["strategy=zero", given]], {})
    assert per_identity(["strategy=ddp"], ddp) == ([["strategy=ddp"]], {})  # nothing declared
    assert per_identity(["strategy=nope"], None) == ([["strategy=nope"]], {})  # does not compose: as it is


def test_the_analysis_lists_each_stage_and_answers_with_the_fastest():
    """Each stage of a search over ZeRO's stages is a strategy of its own in default vs best (its own default and
    best), and the answer is the fastest of all of them."""
    import pandas as pd

    import multirun_analysis as ma

    rows = [dict(model="tiny", world_size=2, strategy="zero", zero_stage=stage, autocast=auto, global_batch=8,
                 seq_len=128, steps=10, warmup_steps=4, label=f"zero-{stage}", tokens_per_s=tps, n_runs=1,
                 command=f"python -m bench strategy=zero strategy.zero_stage={stage} strategy.autocast={auto}")
            for stage, auto, tps in [(0, False, 100.0), (0, True, 110.0), (1, False, 120.0), (1, True, 150.0),
                                     (3, False, 80.0), (3, True, 70.0)]]
    s = pd.DataFrame(rows)
    s.attrs["key_columns"] = ["model", "world_size", "strategy", "zero_stage", "autocast", "global_batch", "seq_len",
                              "steps", "warmup_steps"]
    t = ma.default_vs_best(s).set_index("strategy_id")
    assert sorted(t.index) == ["zero-0", "zero-1", "zero-3"]
    assert t.loc["zero-1", ["default_tokens_per_s", "best_tokens_per_s"]].tolist() == [120.0, 150.0]
    assert t.loc["zero-3", "knobs_that_differ"] == ""  # its default is its best
    lines = "\n".join(ma.ranked(s))
    assert "use **zero-1**" in lines and "strategy.zero_stage=1 strategy.autocast=True" in lines
    assert all(f"zero-{i}: " in lines for i in (0, 1, 3))


# ------------------------------------------------------------------------------ tune.json after each run
def test_a_search_killed_mid_rung_keeps_what_the_rung_measured(tmp_path):
    """A search killed by an outside deadline during a rung (SIGKILL: no handler of its own runs) keeps the rung's
    finished runs: tune.json is written as each run ends (the leader so far, the rest pending), not at the rung's end."""
    sweep = tmp_path / "sweep"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BENCH_BESTS": str(tmp_path / "bests.json"), **fault_env()}
    p = subprocess.Popen([sys.executable, "-m", "bench", "--multirun", *SEARCH, f"hydra.sweep.dir={sweep}"], cwd=REPO,
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    first = None
    try:
        deadline = time.time() + 300
        while first is None and p.poll() is None and time.time() < deadline:
            tune = read_json_dict(sweep / "tune.json")
            if tune and any(t.get("measured") for b in tune["bases"] for t in b["trials"]):
                first = tune  # the first write: one run of rung 0 has ended, the other not
            time.sleep(0.1)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert first is not None, "no tune.json while the search ran"
    kept = _tune(sweep)["bases"][0]
    rung0 = [t for t in kept["trials"] if t.get("rung", -1) >= 0]
    measured = [t["name"] for t in rung0 if "0" in t.get("measured", {})]
    assert measured and kept["winner"]["name"] in measured, kept
    assert [t for t in first["bases"][0]["trials"] if t.get("status") == "pending"], first  # written mid-rung
    assert not processes_left(env)
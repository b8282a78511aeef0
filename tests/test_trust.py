"""The report says what not to trust, on REAL CPU runs: a `single` run (the session's, shared) and a 1-rank `ddp`
run.  Their metrics.json are copied with edited step times, windows or host records (data derived from the real
runs, so that what is flagged does not depend on this machine's speed or load): few timed steps, a large spread
of step times and a busy host are flagged in the tables, the answer and Problems; a flagged winner says so and
names the fastest run that is not flagged; CPU ranks are named as such, the model's size reads in M, and the
efficiency plot starts at zero."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench.metrics.timing import step_time_stats
from bench.units import count_text
from tests.conftest import CPU_FAST, run_bench

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ddp_cpu(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ddp1")
    p = run_bench(*CPU_FAST, "strategy=ddp", "world_size=1", run_dir=d)
    assert p.returncode == 0, p.stderr[-3000:]
    return d


def derive(src: Path, dst: Path, times: list[float] | None = None, others_cpus: float = 0.1,
           tokens_per_s: float | None = None) -> dict:
    """A copy of a real run folder with its step times (and config steps), its ranks' host record (other processes
    keeping ``others_cpus`` of 4 CPUs busy) and its timed window (to give ``tokens_per_s``) edited."""
    shutil.copytree(src, dst)
    m = json.loads((dst / "metrics.json").read_text())
    if times is not None:
        m["step_time_s"] = {**step_time_stats(times), "all": times, "source": m["step_time_s"]["source"]}
        m["run"]["timed_steps"] = len(times)
        m["config"]["steps"] = m["config"]["warmup_steps"] + len(times)
    for r in m["ranks"]:
        r.update(host_cpus=4, process_cpus=1.0, host_busy_cpus=len(m["ranks"]) * 1.0 + others_cpus)
    t = m["throughput"]
    faster = tokens_per_s / t["tokens_per_s"] if tokens_per_s else 1.0
    t["timed_window_s"] /= faster
    t["tokens_per_s"] = t["tokens_timed"] / t["timed_window_s"]
    for r in m["ranks"]:
        r["window_s"] /= faster
    (dst / "metrics.json").write_text(json.dumps(m))
    return m


def steady(n: int, t: float = 0.25) -> list[float]:
    return [t * (1 + 0.01 * ((-1) ** i)) for i in range(n)]


def test_the_real_runs_record_their_hosts_cpu_use(single_cpu, ddp_cpu):
    for d in (single_cpu, ddp_cpu):
        for r in json.loads((d / "metrics.json").read_text())["ranks"]:
            assert r["host_cpus"] >= 1 and r["process_cpus"] > 0, r
            assert 0 <= r["host_busy_cpus"] <= r["host_cpus"] + 0.05, r


def test_few_steps_a_spread_and_a_busy_host_are_flagged(single_cpu, tmp_path):
    import multirun_analysis as ma

    derive(single_cpu, tmp_path / "steady", steady(12))
    derive(single_cpu, tmp_path / "few", steady(3))
    derive(single_cpu, tmp_path / "spread", [0.25, 0.4] * 6)
    derive(single_cpu, tmp_path / "busy", steady(12), others_cpus=2.9)
    want = {"steady": None, "few": "few steps", "spread": "spread", "busy": "host busy"}
    for name, flags in want.items():
        row, _ = ma.read_run(tmp_path / name)
        assert row["not_to_trust"] == flags, (name, row["problems"])
    problems = ma.read_run(tmp_path / "few")[0]["problems"]
    assert "not to trust: 3 timed steps (fewer than 8" in problems
    assert "mean step time is uncertain by ±7.0%" in ma.read_run(tmp_path / "spread")[0]["problems"]
    assert "other processes kept 2.9 of its 4 CPUs busy during the timed window (0.1 idle" in \
        ma.read_run(tmp_path / "busy")[0]["problems"]
    s = ma.summarize(ma.load_runs(tmp_path, warn=False))  # 3 repeats over 12 steps, one experiment over 3
    assert sorted(s["not_to_trust"]) == ["few steps", "spread (1 of 3 runs), host busy (1 of 3 runs)"]


def test_a_flagged_winner_says_so_and_names_the_fastest_run_to_trust(single_cpu, ddp_cpu, tmp_path):
    """The issue's case: a 1-rank DDP run over 3 timed steps is faster than `single` (here by its edited window):
    it is still ranked by its number, but the answer, the tables and Problems say not to trust it."""
    import multirun_analysis as ma

    sweep = tmp_path / "sweep"
    m = derive(single_cpu, sweep / "0", steady(12))
    derive(ddp_cpu, sweep / "1", steady(3), tokens_per_s=1.25 * m["throughput"]["tokens_per_s"])
    a = ma.analyze(sweep, plots=True)
    md = a.report.read_text()
    answer = md.split("## Each strategy")[0]
    head = next(line for line in answer.splitlines() if line.startswith("- **"))
    size = count_text(m["flops"]["total_params"])
    assert re.fullmatch(r"\d+(\.\d+)?M", size), size  # the tiny model reads in M, not as 0.00729B
    assert head.startswith(f"- **tiny ({size} parameters), 1 CPU rank, 1024 tokens per step**: use **ddp**"), head
    assert "**not to trust: few steps** (see Problems)" in head
    assert "the fastest not flagged: single (80%)" in head
    ranked = [line for line in answer.splitlines() if re.match(r"\s+\d\. ", line)]
    assert "not to trust: few steps" in ranked[0] and "not to trust" not in ranked[1]
    problems = md.split("## Problems")[1].split("## Environment")[0]
    assert "/1`: not to trust: 3 timed steps (fewer than 8: their spread is unknown)" in problems
    assert "/0`" not in problems
    assert "| model | strategy | CPU ranks | n |" in md and "GPUs" not in md.split("## Environment")[0]
    assert "| few steps |" in md  # the summary table's column
    assert "fewer than 8 timed steps (few steps)" in answer  # the thresholds, said once
    assert "not to trust" in ma.compact_table(a.summary)
    fig, _ = a.plots["scaling_efficiency"]
    assert fig.axes[0].get_ylim()[0] == 0  # a ratio's axis starts at zero
    assert all(ax.get_xlabel() == "CPU ranks (world_size)" for ax in fig.axes)


def test_runs_without_a_host_record_are_said_unknown_not_flagged(single_cpu, tmp_path):
    import multirun_analysis as ma

    derive(single_cpu, tmp_path / "old", steady(12))
    m = json.loads((tmp_path / "old" / "metrics.json").read_text())
    for r in m["ranks"]:  # as recorded before bench measured its host's CPU use
        for k in ("host_cpus", "host_busy_cpus", "process_cpus"):
            r.pop(k)
    (tmp_path / "old" / "metrics.json").write_text(json.dumps(m))
    a = ma.analyze(tmp_path / "old", out_dir=tmp_path / "out", plots=False)
    assert a.runs["not_to_trust"].isna().all()
    assert ("", "host load not recorded for 1 of 1 completed run(s) (recorded before bench measured its host's CPU "
                "use): whether another process competed with them is unknown") in a.problems


def test_the_docs_quote_the_thresholds_the_analysis_applies():
    from multirun_analysis import trust
    from tests.conftest import REPO

    doc = (REPO / "docs" / "measurement.md").read_text()
    readme = (REPO / "README.md").read_text()
    for quoted in (f"fewer than {trust.MIN_TIMED_STEPS} timed steps", f"above ±{trust.MAX_SEM_PCT:g}%",
                   f"at least {trust.OTHERS_MIN_CPUS:g} CPU", f"less than {trust.IDLE_MIN_CPUS:g} was left idle"):
        assert quoted in doc, quoted
    assert f"fewer than {trust.MIN_TIMED_STEPS} timed steps" in readme

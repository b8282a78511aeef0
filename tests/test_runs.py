"""End-to-end runs on CPU: real processes (torch elastic launch), real gloo groups."""
from __future__ import annotations

import json
import math
import time

import pytest

from bench.metrics import skeleton
from tests.conftest import (CPU_FAST, c10d_threads_left, fault_env, loss_curve, metrics_of, processes_left,
                            record_fault, run_bench)


def _keys(d: dict, prefix="") -> set[str]:
    out = set()
    for k, v in d.items():
        out.add(prefix + k)
        if isinstance(v, dict) and k not in ("config", "layout", "provenance", "error"):
            out |= _keys(v, prefix + k + ".")
    return out


def test_single_writes_every_metrics_field(single_cpu):
    m = metrics_of(single_cpu)
    assert m["status"] == "completed" and m["schema_version"] == 1
    assert _keys(skeleton(m["config"], "completed")) <= _keys(m)
    t = m["throughput"]
    assert t["tokens_per_step"] == t["tokens_per_step_expected"] == 8 * 128
    assert t["tokens_timed"] == 3 * 8 * 128 and t["tokens_per_s"] > 0
    assert len(m["step_time_s"]["all"]) == 3 and m["step_time_s"]["p10"] <= m["step_time_s"]["p90"]
    assert m["config"]["metrics"]["step_timing"] == "events"  # the default; on CPU the host clock either way
    assert m["step_time_s"]["source"] == m["ranks"][0]["step_time_source"] == "host_clock_cpu"
    assert len(m["loss"]["per_step"]) == 4
    # uniform random tokens: the loss stays near ln(V)
    assert abs(m["loss"]["last"] - math.log(8000)) < 0.3
    assert m["flops"]["flops_per_token"] > 0 and "6*N" in m["flops"]["formula"]
    assert m["memory"]["host_peak_rss_mb"] > 0
    assert m["memory"]["max_allocated_mb"] is None  # CPU: does not apply -> null, not missing
    assert m["memory"]["warmup_garbage_freed_mb"] is None and "warmup_garbage_freed_mb" in m["ranks"][0]
    prov = m["provenance"]
    assert prov["versions"]["torch"] and prov["hostname"] and prov["command"][1:3] == ["-m", "bench"]
    assert (single_cpu / "rank0.json").exists() and (single_cpu / ".hydra" / "config.yaml").exists()
    assert json.loads((single_cpu / "status.json").read_text())["status"] == "completed"


def test_ddp_two_ranks_loss_equals_single(single_cpu, bench_run):
    p, d = bench_run(*CPU_FAST, "strategy=ddp", "world_size=2")
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    assert len(m["ranks"]) == 2
    assert m["throughput"]["tokens_per_step"] == 8 * 128  # sum over the two ranks' halves
    for r in m["ranks"]:  # setup time attributed to its parts
        assert list(r["setup_phases_s"]) == ["bench model", "recompute, loss chunks and compile wrappers", "wrap",
                                             "optimizer", "data stream"]
        assert r["preloaded_modules"] == []  # a one-off run: its ranks import torch._dynamo themselves
    ref, got = loss_curve(single_cpu), loss_curve(d)
    assert len(got) == len(ref) == 4
    assert c10d_threads_left(d) == []
    assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-5, (ref, got)


def test_spawned_ranks_equal_forkserver_ranks(single_cpu, bench_run):
    """start_method=spawn (fresh interpreters) trains exactly like the default forkserver ranks."""
    p, d = bench_run(*CPU_FAST, "strategy=ddp", "world_size=2", "start_method=spawn")
    assert p.returncode == 0, p.stderr[-3000:]
    assert metrics_of(d)["config"]["start_method"] == "spawn"
    assert [r["preloaded_modules"] for r in metrics_of(d)["ranks"]] == [[], []]  # each rank imports its own
    assert max(abs(a - b) for a, b in zip(loss_curve(single_cpu), loss_curve(d))) < 1e-5
    # a spawned rank finalizes its interpreter: no c10d thread may still be running then
    assert c10d_threads_left(d) == []


def test_spawned_zero_ranks_skip_finalization_with_deepspeed_groups_left(bench_run):
    """DeepSpeed's engine keeps its process groups alive (ZeRO's hooks hold it through autograd), so
    their gloo threads outlive the release: a spawned rank then ends with os._exit instead of
    finalizing its interpreter with them running (bench/launch/teardown.py), and the run ends cleanly."""
    p, d = bench_run(*CPU_FAST, "strategy=zero", "strategy.zero_stage=3", "world_size=2", "start_method=spawn")
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    assert m["status"] == "completed" and "exit_warning" not in m, m.get("exit_warning")
    left = c10d_threads_left(d)
    assert len(left) == 2 and all("this rank ends with os._exit" in line for line in left), left


def test_split_cpu_affinity_pins_each_rank_to_its_own_cpus(single_cpu, bench_run):
    """cpu_affinity=split: each local rank runs on its own share of the CPUs (recorded per rank), and
    trains exactly as before."""
    import os

    p, d = bench_run(*CPU_FAST, "strategy=ddp", "world_size=2", "cpu_affinity=split")
    assert p.returncode == 0, p.stderr[-3000:]
    cpus = [set(r["cpus"]) for r in metrics_of(d)["ranks"]]
    share = len(os.sched_getaffinity(0)) // 2
    assert all(len(c) == share for c in cpus) and not cpus[0] & cpus[1]
    assert cpus[0] | cpus[1] <= os.sched_getaffinity(0)
    assert max(abs(a - b) for a, b in zip(loss_curve(single_cpu), loss_curve(d))) < 1e-5


def test_gradient_accumulation_is_the_same_optimizer_step(single_cpu, bench_run):
    p, d = bench_run(*CPU_FAST, "strategy=ddp", "world_size=2", "strategy.micro_batch_size=1")
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    assert m["layout"]["grad_accum"] == 4 and m["throughput"]["tokens_per_step"] == 8 * 128
    assert max(abs(a - b) for a, b in zip(loss_curve(single_cpu), loss_curve(d))) < 1e-5
    # the ranks' teardown warns of nothing (its isinstance() over every module's attributes met torch 2.13's
    # deprecated torch.distributed.reduce_op and printed a FutureWarning on each rank)
    assert "Warning" not in p.stderr, [ln for ln in p.stderr.splitlines() if "Warning" in ln]


def test_failing_rank_ends_run_quickly_with_traceback(bench_run):
    t0 = time.time()
    p, d = bench_run(*CPU_FAST, "steps=50", "strategy=ddp", "world_size=2",
                     "fault.kind=raise", "fault.rank=1", "fault.step=2")
    elapsed = time.time() - t0
    assert p.returncode == 1
    m = metrics_of(d)
    assert m["status"] == "failed" and m["error"]["rank"] == 1
    assert "injected fault on rank 1" in m["error"]["message"]
    assert "Traceback" in m["error"]["traceback"] and "inject_fault" in m["error"]["traceback"]
    assert "injected fault" in (d / "__main__.log").read_text()  # the run's log has it too
    assert elapsed < 120  # 50 steps never ran: the agent tore the run down


def test_crash_after_completed_run_keeps_the_results(bench_run):
    p, d = bench_run(*CPU_FAST, "strategy=ddp", "world_size=2", "fault.kind=crash_at_exit", "fault.rank=1")
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    assert m["status"] == "completed" and "rank 1 exited with code" in m["exit_warning"]


@pytest.mark.parametrize("kind,teardown_s,run_s,warning", [
    ("hang_at_exit", 5, 120, "the teardown did not finish within teardown_timeout_s=5"),
    ("hang_at_exit", 600, 40, "did not exit within run_timeout_s=40"),  # a deadline past the run's limit
    # a process that has left Python (os._exit) and does not end: only the launcher can end it
    ("stuck_at_exit", 5, 120, "did not exit within teardown_timeout_s=5 after the run completed and were terminated"),
])
def test_hang_after_completed_run_keeps_the_results(bench_run, kind, teardown_s, run_s, warning):
    """A teardown that never returns (seen after NCCL collectives in CUDA graphs) is ended by
    teardown_timeout_s (or run_timeout_s, whichever comes first), and the measurement rank 0 wrote
    before it is kept."""
    t0 = time.time()
    p, d = bench_run(*CPU_FAST, "strategy=ddp", "world_size=2", f"fault.kind={kind}", "fault.rank=1",
                     f"teardown_timeout_s={teardown_s}", f"run_timeout_s={run_s}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert time.time() - t0 < max(teardown_s, run_s)  # ended by the first deadline, not the later one
    m = metrics_of(d)
    assert m["status"] == "completed" and m["throughput"]["tokens_per_s"] > 0
    # the rank's own teardown deadline ends it with its stacks; on a loaded machine the launcher's (the same
    # deadline + TEARDOWN_GRACE_S after rank 0's result) may come first: either ends it by teardown_timeout_s
    launcher = f"did not exit within teardown_timeout_s={teardown_s} after the run completed and were terminated"
    own = kind == "hang_at_exit" and teardown_s < run_s
    assert warning in m["exit_warning"] or (own and launcher in m["exit_warning"]), m["exit_warning"]
    rank1_log = (d / "rank1.log").read_text()
    if warning in m["exit_warning"]:
        assert ("inject_fault" in rank1_log) == own  # faulthandler's stacks, written where the rank ended itself


def test_oom_is_classified(bench_run):
    p, d = bench_run(*CPU_FAST, "fault.kind=oom", "fault.step=1")
    assert p.returncode == 1 and metrics_of(d)["status"] == "oom"


def test_hung_run_is_killed_by_run_timeout(bench_run):
    """A rank that hangs mid-run (the fault suite, tests/test_faults.py): run_timeout_s ends the run,
    status timeout recorded, and no process of it (ranks, fork server) is left behind."""
    t0 = time.time()
    env = fault_env()
    p, d = bench_run(*CPU_FAST, "strategy=ddp", "world_size=2", "fault.kind=hang", "fault.rank=0",
                     "fault.step=1", "run_timeout_s=25", env=env)
    left = processes_left(env)
    m = metrics_of(d)
    record_fault("a rank hangs past run_timeout_s (ddp, 2 ranks)", m["status"], 0 if m["status"] == "timeout" else 1,
                 len(left), m["error"]["message"])
    assert p.returncode == 1 and m["status"] == "timeout"
    assert time.time() - t0 < 90
    assert not left, left


def test_multirun_gives_one_folder_per_job_and_records_the_invalid_one(tmp_path):
    sweep = tmp_path / "sweep"
    p = run_bench("strategy=single,ddp", "world_size=1,2", *CPU_FAST,
                  run_dir=sweep, multirun=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = {}
    for d in sorted(x for x in sweep.iterdir() if x.is_dir() and not x.name.startswith(".")):  # .claims: bookkeeping
        m = metrics_of(d)
        jobs[(m["run"]["strategy"], m["run"]["world_size"])] = m
    assert set(jobs) == {("single", 1), ("single", 2), ("ddp", 1), ("ddp", 2)}
    bad = jobs[("single", 2)]
    assert bad["status"] == "invalid" and bad["error"]["key"] == "world_size"
    assert all(jobs[k]["status"] == "completed" for k in jobs if k != ("single", 2))

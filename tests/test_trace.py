"""Per-rank traces and their compute / communication / overlapped / idle breakdown
(bench/metrics/trace.py), and the report's stacked bars (multirun_analysis/breakdown.py)."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.metrics import trace
from tests.conftest import REPO, metrics_of, run_bench

PARTS = ("compute", "communication", "overlapped", "idle", "wall")


# ------------------------------------------------------------------------------ the reader, on made-up traces
def test_interval_algebra():
    u = trace.union([(5, 12), (0, 10), (20, 21), (6, 7)])
    assert u == [(0, 12), (20, 21)] and trace.length(u) == 13
    assert trace.intersect(u, [(11, 20.5)]) == [(11, 12), (20, 20.5)]
    assert trace.subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert trace.clip([(0, 10), (12, 14)], 5, 13) == [(5, 10), (12, 13)]


def _x(name, cat, tid, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_cpu_trace_breakdown():
    """Training thread 1 and gloo's worker thread 2; one step of 100 us."""
    ev = [_x("ProfilerStep#7", "user_annotation", 1, 0, 100),
          _x("DistributedDataParallel.forward", "user_annotation", 1, 0, 30),
          _x("aten::linear", "cpu_op", 1, 2, 20),
          _x("c10d::broadcast_", "cpu_op", 1, 22, 5),  # blocking comm inside forward: not compute
          _x("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 1, 40, 30),
          _x("c10d::allreduce_", "cpu_op", 1, 70, 2),  # the enqueue on the training thread
          _x("gloo:all_reduce", "user_annotation", 2, 60, 25),  # the collective on gloo's thread
          _x("aten::broadcast_tensors", "cpu_op", 1, 90, 5)]  # an aten op, not communication
    b = trace.breakdown({"traceEvents": ev}, ndigits=9)
    assert b["source"] == "cpu_ops" and b["steps"] == 1
    ms = {k: 1e3 * v for k, v in b["ms_per_step"].items()}  # back to us
    # compute: [0,22) u [27,30) u [40,70) u [90,95) = 22 + 3 + 30 + 5; comm: [22,27) u [60,85)
    assert ms["compute"] == pytest.approx(60) and ms["communication"] == pytest.approx(30)
    assert ms["overlapped"] == pytest.approx(10)  # gloo's all-reduce [60,70) under the backward
    assert ms["idle"] == pytest.approx(100 - 80) and ms["wall"] == pytest.approx(100)


def gpu_trace(rank: int) -> dict:
    """Two steps of 100 us on a GPU: a gemm, an NCCL all-reduce on another stream that overlaps it
    and the next kernel by 10 us each, an idle gap of 10 us; kernels linked to their launches."""
    ev, corr = [], [0]
    pid = 100 + rank

    def kernel(name, stream, ts, dur):
        corr[0] += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
                   "ts": ts, "dur": 1, "args": {"correlation": corr[0]}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                   "args": {"device": 0, "stream": stream, "correlation": corr[0]}})
    for n, t0 in ((4, 1000.0), (5, 1100.0)):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": pid, "tid": pid,
                   "ts": t0, "dur": 100, "args": {}})
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 7, t0, 30)
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 13, t0 + 20, 40)
        kernel("vectorized_elementwise_kernel", 7, t0 + 50, 20)
        kernel("multi_tensor_apply_kernel", 7, t0 + 80, 20)
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "deviceProperties": [], "traceEvents": ev}


def test_gpu_trace_breakdown_reads_kernels():
    b = trace.breakdown(gpu_trace(0), ndigits=9)
    assert b["source"] == "gpu_kernels" and b["steps"] == 2
    us = {k: 1e3 * v for k, v in b["ms_per_step"].items()}
    assert us == pytest.approx({"compute": 70, "communication": 40, "overlapped": 20, "idle": 10, "wall": 100})


def test_gpu_breakdown_agrees_with_holistic_trace_analysis(tmp_path):
    """On GPU traces bench's reader gives HTA's numbers (HTA cannot read bench's CPU traces)."""
    pytest.importorskip("hta", reason="HolisticTraceAnalysis not installed (optional: pip install HolisticTraceAnalysis)")
    from hta.trace_analysis import TraceAnalysis

    for r in (0, 1):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(gpu_trace(r)))
    a = TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True)
    tb = a.get_temporal_breakdown(visualize=False).set_index("rank")
    ov = a.get_comm_comp_overlap(visualize=False).set_index("rank")
    for r in (0, 1):
        ours = trace.breakdown(gpu_trace(r), ndigits=9)["ms_per_step"]
        n = 2
        assert tb.loc[r, "compute_time(us)"] / n == pytest.approx(1e3 * ours["compute"])
        assert tb.loc[r, "idle_time(us)"] / n == pytest.approx(1e3 * ours["idle"])
        assert tb.loc[r, "non_compute_time(us)"] / n == pytest.approx(1e3 * (ours["communication"] - ours["overlapped"]))
        assert ov.loc[r, "comp_comm_overlap_pctg"] == pytest.approx(100 * ours["overlapped"] / ours["communication"])


# ------------------------------------------------------------------------------ a real 2-rank gloo DDP run
@pytest.fixture(scope="module")
def ddp_profiled(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("trace") / "ddp"
    p = run_bench("strategy=ddp", "world_size=2", "device=cpu", "precision=fp32", "metrics.profile_steps=2",
                  "steps=6", "warmup_steps=2", run_dir=d)
    assert p.returncode == 0, p.stderr[-3000:]
    return d


@pytest.mark.slow
def test_ddp_run_writes_both_traces_and_a_consistent_breakdown(ddp_profiled):
    m = metrics_of(ddp_profiled)
    assert m["step_time_s"]["n"] == 4  # the profiled steps are extra, not timed
    for r in (0, 1):
        path = ddp_profiled / f"trace_rank{r}.json.gz"
        with gzip.open(path, "rt") as f:
            t = json.load(f)  # valid gzipped Chrome trace JSON
        assert isinstance(t["traceEvents"], list) and t["traceEvents"]
        assert t["distributedInfo"]["rank"] == r
        names = {e.get("name") for e in t["traceEvents"]}
        assert {"ProfilerStep#4", "ProfilerStep#5"} <= names  # the profiled steps: the last 2 of 6
        assert any(str(n).startswith(("gloo:", "c10d::")) for n in names)  # DDP's collectives
        prof = m["profile"][r]
        assert prof["trace_file"] == path.name and prof["breakdown_source"] == "cpu_ops"
        b = prof["breakdown_ms_per_step"]
        assert set(b) == set(PARTS) and all(b[k] >= 0 for k in PARTS)
        assert b["compute"] > 0 and b["communication"] > 0
        assert b["overlapped"] <= min(b["compute"], b["communication"]) + 1e-3
        assert b["compute"] + b["communication"] - b["overlapped"] + b["idle"] == pytest.approx(b["wall"], abs=0.01)
        # the trace's window is the profiled steps, which the profiler's own clock timed too
        assert b["wall"] == pytest.approx(prof["wall_ms_per_step"], rel=0.05)
        assert trace.breakdown(path)["ms_per_step"] == b  # the same numbers read back from the file


@pytest.mark.slow
def test_analysis_report_draws_the_breakdown(ddp_profiled):
    p = subprocess.run([sys.executable, "-m", "multirun_analysis", str(ddp_profiled)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    out = ddp_profiled / "analysis"
    png = out / "time_breakdown.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "## Where a profiled step's time goes" in md and "![time_breakdown](time_breakdown.png)" in md
    m = metrics_of(ddp_profiled)
    mean = lambda k: sum(r["breakdown_ms_per_step"][k] for r in m["profile"]) / 2  # noqa: E731
    import pandas as pd

    s = pd.read_csv(out / "summary.csv")
    row = s[s["strategy"] == "ddp"].iloc[0]
    for k in PARTS:
        assert row[f"prof_{k}_ms"] == pytest.approx(mean(k))  # mean over the two ranks

"""GPU checks (skipped without CUDA): run on the device host, outcomes recorded in results/."""
from __future__ import annotations

import pytest

from tests.conftest import loss_curve, metrics_of

GPU_FAST = ["device=cuda", "precision=fp32", "steps=6", "warmup_steps=2"]


@pytest.mark.gpu
def test_cuda_run_fills_gpu_metrics(bench_run):
    p, d = bench_run("device=cuda", "precision=bf16", "steps=6", "warmup_steps=2")
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    assert m["run"]["device_type"] == "cuda" and m["provenance"]["versions"]["cuda"]
    assert m["memory"]["max_allocated_mb"] > 0 and m["memory"]["max_reserved_mb"] >= m["memory"]["max_allocated_mb"]
    assert m["memory"]["nvml_used_peak_mb"] > 0 and m["utilization"]["gpu_util_mean_pct"] is not None
    assert m["flops"]["peak_tflops"] and m["flops"]["mfu"] > 0 and m["flops"]["matmul_peak_tflops_measured"] > 0


@pytest.mark.gpu
def test_expandable_segments_reach_the_ranks_allocator_and_its_record(bench_run):
    p, d = bench_run(*GPU_FAST, "allocator=expandable_segments")
    assert p.returncode == 0, p.stderr[-3000:]
    assert metrics_of(d)["memory"]["allocator"]["conf"] == "expandable_segments:True"


@pytest.mark.gpu
@pytest.mark.parametrize("timing,source", [("events", "cuda_events"), ("sync", "host_sync_each_step")])
def test_step_timing_source(bench_run, timing, source):
    p, d = bench_run("device=cuda", "model=10m", "precision=bf16", "steps=12", "warmup_steps=4",
                     "metrics.measure_matmul_peak=false", f"metrics.step_timing={timing}")
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    st, window = m["step_time_s"], m["throughput"]["timed_window_s"]
    assert st["source"] == source and st["n"] == len(st["all"]) == 8 and min(st["all"]) > 0
    if timing == "events":  # back-to-back events cover the window but for the host's lead-in and final sync
        assert abs(sum(st["all"]) - window) <= 0.1 * window, (sum(st["all"]), window)


@pytest.mark.gpu2
def test_nccl_ddp_loss_matches_single(bench_run):
    p1, d1 = bench_run(*GPU_FAST)
    p2, d2 = bench_run(*GPU_FAST, "strategy=ddp", "world_size=2")
    assert p1.returncode == 0 and p2.returncode == 0, (p1.stderr[-2000:], p2.stderr[-2000:])
    assert metrics_of(d2)["provenance"]["versions"]["nccl"]
    # TF32 is off in fp32; the all-reduce changes the summation order only
    assert max(abs(a - b) for a, b in zip(loss_curve(d1), loss_curve(d2))) < 1e-4


@pytest.mark.gpu2
def test_failing_nccl_rank_ends_the_run_as_failed_not_timeout(bench_run):
    """Rank 1 raises while rank 0 waits in an all-reduce: the failing rank aborts its NCCL group
    (destroy would wait for the peer), so the run is recorded failed, long before run_timeout_s."""
    p, d = bench_run(*GPU_FAST, "strategy=ddp", "world_size=2", "fault.kind=raise", "fault.rank=1",
                     "fault.step=3", "run_timeout_s=240")
    assert p.returncode != 0
    m = metrics_of(d)
    assert m["status"] == "failed", m["error"]
    assert m["error"]["rank"] == 1 and "injected fault" in m["error"]["message"]


@pytest.mark.gpu
def test_profile_on_gpu_reports_kernels_by_kind(bench_run):
    p, d = bench_run("device=cuda", "precision=bf16", "steps=6", "warmup_steps=2", "metrics.profile_steps=2")
    assert p.returncode == 0, p.stderr[-3000:]
    prof = metrics_of(d)["profile"][0]
    assert 0 < prof["gpu_busy_fraction"] <= 1 and prof["kernels_per_step"] > 0
    assert prof["kernel_ms_per_step"].get("matmul", 0) > 0
    assert not any(k.startswith("nccl:") for k in prof["top_kernels_ms_per_step"])  # no GPU annotations


@pytest.mark.gpu
def test_zero_autocast_fp16_follows_single(bench_run):
    """ZeRO-0 with strategy.autocast=true in fp16 is single's recipe (fp32 weights, autocast,
    GradScaler): the same losses within fp16 noise and the same count of skipped steps, which
    bench reads from the GradScaler since DeepSpeed's was_step_applied() does not see them."""
    fp16 = ["device=cuda", "precision=fp16", "model=10m", "steps=8", "warmup_steps=2",
            "metrics.measure_matmul_peak=false"]
    p1, d1 = bench_run(*fp16)
    p2, d2 = bench_run(*fp16, "strategy=zero", "strategy.autocast=true")
    assert p1.returncode == 0 and p2.returncode == 0, (p1.stderr[-2000:], p2.stderr[-2000:])
    single, zero = metrics_of(d1), metrics_of(d2)
    assert zero["layout"]["ds_config"]["torch_autocast"] == {"enabled": True, "dtype": "float16"}
    assert zero["skipped_steps"] == single["skipped_steps"]
    assert max(abs(a - b) for a, b in zip(loss_curve(d1), loss_curve(d2))) < 1e-3


@pytest.mark.gpu
def test_zero_cuda_graphs_follow_single(bench_run):
    """ZeRO-1/2 with CUDA graphs (compile_mode=reduce-overhead) keep single's losses: the forward and
    backward replay from graphs while DeepSpeed's gradient hooks still run eagerly around them."""
    a = ["device=cuda", "precision=bf16", "model=10m", "steps=8", "warmup_steps=3", "compile=true",
         "compile_mode=reduce-overhead", "metrics.measure_matmul_peak=false"]
    p, d = bench_run(*a)
    assert p.returncode == 0, p.stderr[-2000:]
    for stage in (1, 2):
        pz, dz = bench_run(*a, "strategy=zero", f"strategy.zero_stage={stage}", "strategy.autocast=true")
        assert pz.returncode == 0, pz.stderr[-2000:]
        assert metrics_of(dz)["layout"]["compiled"] is True
        assert max(abs(x - y) for x, y in zip(loss_curve(d), loss_curve(dz))) < 2e-3, stage


@pytest.mark.gpu
def test_zero2_cuda_graphs_over_two_micro_batches_follow_single(bench_run):
    """ZeRO-2 keeps CUDA graphs with gradient accumulation (its hooks move each gradient out every micro-batch), where
    single / DDP / ZeRO-0-1 are refused (bench/parallel/compile.py; one H100, Llama 3.2 1B: ZeRO-2 ran at 4 x 2,
    results/2026-12-06-h100x1-graphs-and-host): the same losses as single's eager step at the same micro-batches."""
    a = ["device=cuda", "precision=bf16", "model=10m", "steps=8", "warmup_steps=3", "model.global_batch=8",
         "strategy.micro_batch_size=4", "metrics.measure_matmul_peak=false"]
    p, d = bench_run(*a)
    assert p.returncode == 0, p.stderr[-2000:]
    pz, dz = bench_run(*a, "strategy=zero", "strategy.zero_stage=2", "strategy.autocast=true", "compile=true",
                       "compile_mode=reduce-overhead")
    assert pz.returncode == 0, pz.stderr[-2000:]
    assert metrics_of(dz)["layout"]["grad_accum"] == 2
    assert max(abs(x - y) for x, y in zip(loss_curve(d), loss_curve(dz))) < 2e-3


@pytest.mark.gpu
def test_zero3_leaf_blocks_and_deepcompile_follow_single(bench_run):
    """The two ways past ZeRO-3's per-module hooks keep single's losses on CUDA: blocks as leaf
    modules (eager) and DeepSpeed's DeepCompile, past the step (5) where it adds its prefetch passes."""
    a = ["device=cuda", "precision=bf16", "model=10m", "steps=10", "warmup_steps=3", "metrics.measure_matmul_peak=false"]
    p, d = bench_run(*a)
    assert p.returncode == 0, p.stderr[-2000:]
    z3 = ["strategy=zero", "strategy.zero_stage=3", "strategy.autocast=true"]
    for extra in (["strategy.leaf_blocks=true"], ["compile=true", "strategy.deepcompile=true"]):
        pz, dz = bench_run(*a, *z3, *extra)
        assert pz.returncode == 0, pz.stderr[-2000:]
        lay = metrics_of(dz)["layout"]
        assert lay["deepcompile"] is ("compile=true" in extra)
        assert max(abs(x - y) for x, y in zip(loss_curve(d), loss_curve(dz))) < 2e-3, extra


@pytest.mark.gpu
def test_fsdp2_units_and_local_shard_adamw_follow_single(bench_run):
    """FSDP2 on CUDA steps fused AdamW over each rank's local shards, per block and in units of
    2 blocks (compiled): single's losses in fp32. In fp16 (FSDP computes in fp16, not autocast)
    the ShardedGradScaler path steps the same optimizer and stays near single's curve."""
    a = ["device=cuda", "model=10m", "steps=8", "warmup_steps=2", "metrics.measure_matmul_peak=false"]
    for prec, tol in (("fp32", 5e-4), ("fp16", 5e-2)):
        p, d = bench_run(*a, f"precision={prec}")
        assert p.returncode == 0, p.stderr[-2000:]
        for extra in ([], ["strategy.blocks_per_unit=2", "compile=true"]):
            pf, df = bench_run(*a, f"precision={prec}", "strategy=fsdp", *extra)
            assert pf.returncode == 0, pf.stderr[-2000:]
            lay = metrics_of(df)["layout"]
            assert lay["optimizer"] == "torch.optim.AdamW(fused=True) over each rank's local shards"
            assert lay["blocks_per_unit"] == (2 if extra else 1)
            diff = max(abs(x - y) for x, y in zip(loss_curve(d), loss_curve(df)))
            assert diff < tol, (prec, extra, diff)

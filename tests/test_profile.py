"""metrics.profile_steps: a torch.profiler pass after the timed window (bench/metrics/profile.py)."""
from __future__ import annotations

from tests.conftest import CPU_FAST, metrics_of

from bench.metrics.profile import _union_us, kind_of


def test_kernel_kinds_and_busy_union():
    assert kind_of("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    assert kind_of("pytorch_flash::flash_bwd_kernel") == "attention"
    assert kind_of("multi_tensor_apply_kernel<FusedAdam>") == "optimizer"
    assert kind_of("vectorized_elementwise_kernel") == "other"
    # the loss' softmax is not attention: eager cross entropy's kernels and Inductor's fused log_softmax
    assert kind_of("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
                   "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>") == "other"
    assert kind_of("triton_red_fused__log_softmax__to_copy_0") == "other"
    assert kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7") == "attention"
    # overlapping kernels on two streams count once: [0,10] u [5,12] u [20,21] = 13
    assert _union_us([(5, 12), (0, 10), (20, 21), (6, 7)]) == 13


def test_profile_runs_after_the_timed_window_on_every_rank(bench_run):
    p, d = bench_run(*CPU_FAST, "strategy=ddp", "world_size=2", "metrics.profile_steps=2")
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    assert m["step_time_s"]["n"] == 3  # the profiled steps are extra, not timed
    assert len(m["profile"]) == 2
    for prof in m["profile"]:
        assert prof["steps"] == 2 and prof["wall_ms_per_step"] > 0
        assert any("mm" in op for op in prof["top_cpu_ops_ms_per_step"])  # CPU: top operators


def test_profile_steps_beyond_the_run_is_refused(bench_run):
    p, d = bench_run(*CPU_FAST, "metrics.profile_steps=9")
    assert p.returncode != 0
    assert "metrics.profile_steps=9" in p.stderr + p.stdout

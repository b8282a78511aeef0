"""llama_tiny (RMSNorm, SwiGLU, RoPE, grouped-query attention) under every strategy that runs on CPU, with
and without activation recomputation: real gloo runs whose fp32 losses equal strategy=single's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import CPU_FAST, loss_curve, metrics_of, run_bench

LLAMA = [*CPU_FAST, "model=llama_tiny"]


def _sweep(tmp_path_factory, name: str, *overrides: str) -> dict[str, dict]:
    d = tmp_path_factory.mktemp(name)
    p = run_bench(*LLAMA, *overrides, run_dir=d, multirun=True, timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    out = {}
    for sub in sorted(x for x in d.iterdir() if (x / "metrics.json").exists()):
        m = json.loads((sub / "metrics.json").read_text())
        c = m["config"]
        out[f"{c['strategy']['name']}/{c['recompute']}"] = m
    return out


@pytest.fixture(scope="module")
def llama_single(tmp_path_factory) -> list[float]:
    d = tmp_path_factory.mktemp("llama_single")
    p = run_bench(*LLAMA, "strategy=single", run_dir=d, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return loss_curve(d)


def _same(m: dict, ref: list[float]) -> None:
    assert m["status"] == "completed", m.get("error")
    got = m["loss"]["per_step"]
    assert max(abs(a - b) for a, b in zip(got, ref)) < 1e-5, (got, ref)


def test_recompute_full_and_selective_train_the_same_model(llama_single, tmp_path_factory):
    runs = _sweep(tmp_path_factory, "llama_recompute", "strategy=single", "recompute=full,selective")
    for key, m in runs.items():
        _same(m, llama_single)
        assert m["layout"]["recompute"].startswith(m["config"]["recompute"])
        assert m["flops"]["hardware_flops_per_token"] > m["flops"]["flops_per_token"]  # HFU counts the re-run


def test_data_parallel_strategies_with_full_recompute(llama_single, tmp_path_factory):
    runs = _sweep(tmp_path_factory, "llama_dp", "strategy=ddp,fsdp,zero", "world_size=2", "recompute=full")
    assert sorted(runs) == ["ddp/full", "fsdp/full", "zero/full"]
    for m in runs.values():
        _same(m, llama_single)


def test_torch_tensor_and_pipeline_parallel(llama_single, tmp_path_factory):
    """TP=2 splits the 8 query and 4 key/value heads (and gate/up/down) over 2 ranks; PP=2 splits the blocks."""
    runs = _sweep(tmp_path_factory, "llama_mp", "strategy=tp,pp", "strategy.impl=torch", "world_size=2")
    for m in runs.values():
        _same(m, llama_single)
    assert "mlp.gate_proj" in runs["tp/none"]["layout"]["tp_plan"] and "mlp.down_proj" in runs["tp/none"]["layout"]["tp_plan"]


def test_fsdp_over_tensor_parallel_two_dimensions(llama_single, bench_run):
    p, d = bench_run(*LLAMA, "strategy=fsdp", "strategy.tp=2", "world_size=4", "recompute=full")
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    _same(m, llama_single)
    assert (m["layout"]["tp"], m["layout"]["dp"]) == (2, 2) and "FSDP2" in m["layout"]["dp_reduction"]
    assert Path(d).exists()

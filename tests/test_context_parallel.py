"""Context parallelism (strategy.cp): where it is refused, in one line, before a process starts, and on GPU
that FSDP2 x CP follows single (the ring attention over the sequence shards is PyTorch's; tests/GPU runs are
recorded in results/2026-11-27-h100x4-context-parallel)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bench.layout import Coord, Layout
from tests.conftest import loss_curve, metrics_of

LLAMA = ["model=llama_tiny", "model.seq_len=64"]


def test_cp_is_inside_tp_in_megatrons_rank_order():
    lay = Layout(tp=2, pp=1, dp=2, cp=2)
    assert lay.world_size == 8 and lay.mesh_shape == (1, 2, 2, 2)
    assert [lay.coords(r) for r in (1, 2, 4, 7)] == [Coord(dp=0, pp=0, tp=1, cp=0), Coord(dp=0, pp=0, tp=0, cp=1),
                                                    Coord(dp=1, pp=0, tp=0, cp=0), Coord(dp=1, pp=0, tp=1, cp=1)]
    # each cp rank counts its share of its replica's tokens; tp rank 1 counts none; the sum is the global batch
    tokens = [lay.tokens_this_rank(r, global_batch=8, seq_len=64) for r in range(8)]
    assert tokens == [128, 0, 128, 0, 128, 0, 128, 0] and sum(tokens) == 8 * 64


def _refusal(*overrides: str) -> str:
    p = subprocess.run([sys.executable, "-m", "bench", *overrides], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = [line for line in (p.stdout + p.stderr).splitlines() if "invalid config" in line]
    assert lines, (p.stdout[-2000:], p.stderr[-2000:])
    return lines[0]


@pytest.mark.parametrize("overrides,words", [
    (["strategy=fsdp", "strategy.cp=2", "world_size=2"], "runs only on CUDA"),
    (["strategy=fsdp", "strategy.cp=2", "world_size=2", "model.seq_len=66", "dry_run=true",
      "hardware=h100_sxm_80gb"], "divisible by 2 x cp = 4"),
    (["strategy=fsdp", "strategy.cp=2", "strategy.pp=2", "world_size=4", "dry_run=true",
      "hardware=h100_sxm_80gb"], "strategy.pp=2 is not implemented"),
    (["strategy=megatron", "strategy.cp=2", "world_size=2", "dry_run=true", "hardware=h100_sxm_80gb"],
     "Transformer Engine"),
    (["strategy=tp", "strategy.impl=torch", "strategy.cp=2", "world_size=4", "dry_run=true", "hardware=h100_sxm_80gb"],
     "implemented for strategy=fsdp"),
])
def test_cp_refused_in_one_line_before_launch(overrides, words):
    assert words in _refusal(*LLAMA, *overrides)


@pytest.mark.gpu2
@pytest.mark.parametrize("extra", [[], ["strategy.tp=2"]])
def test_fsdp_cp_follows_single(bench_run, extra):
    """fp32 (TF32 off): ring attention over two sequence shards and FSDP2 over dp x cp change summation order only.
    With tp=2 it needs four GPUs."""
    import torch

    if extra and torch.cuda.device_count() < 4:
        pytest.skip("needs four CUDA GPUs")
    fast = ["device=cuda", "precision=fp32", "steps=6", "warmup_steps=2", *LLAMA]
    p1, d1 = bench_run(*fast)
    p2, d2 = bench_run(*fast, "strategy=fsdp", "strategy.cp=2", f"world_size={4 if extra else 2}", *extra)
    assert p1.returncode == 0 and p2.returncode == 0, (p1.stderr[-2000:], p2.stderr[-2000:])
    lay = metrics_of(d2)["layout"]
    assert lay["cp"] == 2 and "context_parallel" in lay["context_parallel"]
    assert max(abs(a - b) for a, b in zip(loss_curve(d1), loss_curve(d2))) < 1e-4

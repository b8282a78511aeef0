"""The one model and the one data stream (no processes)."""
from __future__ import annotations

import torch

from bench.models.data import SyntheticStream, global_batch
from bench.metrics import flops
from bench.models.model import GPT, build_model
from bench.spec.schema import ModelConfig, typed

TINY = dict(name="tiny", d_model=64, n_heads=4, n_layers=2, d_ff=256, vocab_size=500, seq_len=16, global_batch=8)
TINY_MODEL = typed(ModelConfig, TINY)


def test_global_batch_is_deterministic_and_distinct_per_step():
    a = global_batch(3, seed=0, vocab_size=500, seq_len=16, batch=8)
    b = global_batch(3, seed=0, vocab_size=500, seq_len=16, batch=8)
    c = global_batch(4, seed=0, vocab_size=500, seq_len=16, batch=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.min() >= 0 and a.max() < 500 and a.shape == (8, 17)


def test_data_parallel_slices_partition_the_global_batch():
    full = SyntheticStream(TINY_MODEL, seed=1, steps=3, dp_rank=0, dp_size=1, device="cpu")
    for dp in (2, 4, 8):
        parts = [SyntheticStream(TINY_MODEL, seed=1, steps=3, dp_rank=r, dp_size=dp, device="cpu") for r in range(dp)]
        for n in range(3):
            x = torch.cat([p[n][0] for p in parts])
            y = torch.cat([p[n][1] for p in parts])
            assert torch.equal(x, full[n][0]) and torch.equal(y, full[n][1])


def test_micro_batches_cover_the_rank_slice():
    s = SyntheticStream(TINY_MODEL, seed=0, steps=1, dp_rank=0, dp_size=1, device="cpu")
    mbs = s.micro_batches(0, 2)
    assert len(mbs) == 4 and torch.equal(torch.cat([x for x, _ in mbs]), s[0][0])


def test_same_seed_same_weights():
    a, b = build_model(TINY_MODEL, 0, "cpu"), build_model(TINY_MODEL, 0, "cpu")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_flops_parameter_count_matches_the_module():
    m = GPT(**TINY)
    emb = m.tok_emb.weight.numel() + m.pos_emb.weight.numel()
    total = sum(p.numel() for p in m.parameters())
    spec = typed(ModelConfig, TINY)  # bench/metrics/flops.py reads a ModelConfig
    assert flops.total_params(spec) == total
    assert flops.matmul_params(spec) == total - emb
    assert flops.flops_per_token(spec) == 6 * (total - emb) + 12 * 2 * 64 * 16


def test_forward_shapes_and_initial_loss_near_ln_vocab():
    m = build_model(TINY_MODEL, 0, "cpu")
    x = global_batch(0, seed=0, vocab_size=500, seq_len=16, batch=8)
    logits = m(x[:, :-1])
    assert logits.shape == (8, 16, 500)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 500), x[:, 1:].reshape(-1))
    assert abs(loss.item() - torch.log(torch.tensor(500.0)).item()) < 0.1


def test_peak_table_lookup():
    assert flops.peak_tflops("NVIDIA H200", "bf16", False)[0] == 989.4
    assert flops.peak_tflops("NVIDIA H100 PCIe", "bf16", False)[0] == 756.0
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "fp32", True)[0] == 494.7
    assert flops.peak_tflops(None, "bf16", False)[0] is None

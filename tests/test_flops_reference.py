"""MFU's numerator against an independent reference: PyTorch's FlopCounterMode counting the matmuls that one
forward + backward of bench's own model executes (bench/metrics/flops.py counts them from the model's sizes).

SDPA runs its math backend here, so that the counter sees attention's two batched matmuls (its CPU flash kernel
is not counted); like the formula (PaLM appendix B), it counts the full s x s scores, causal or not.  The formula
also counts norms and biases at 6 FLOPs a parameter, which execute no matmul: a few tenths of a percent."""
from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from bench.run.config import register_configs
from bench.spec.schema import ModelConfig, typed
from bench.metrics.flops import flops_per_token, total_params
from bench.models.model import build_model, lm_loss
from bench.spec.schema import ModelConfig, typed
from tests.conftest import REPO

register_configs()


def model_cfg(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)).model, resolve=True)


@pytest.mark.parametrize("overrides", [("model=tiny",), ("model=llama_tiny",),
                                       ("model=gpt2", "model.n_layers=2", "model.seq_len=128")])
def test_flops_per_token_match_pytorchs_flop_counter(overrides):
    m = model_cfg(*overrides)
    spec = typed(ModelConfig, m)  # bench/metrics/flops.py reads a ModelConfig
    model = build_model(spec, 0, "cpu")
    b, s = 2, m["seq_len"]
    x = torch.randint(0, m["vocab_size"], (b, s + 1))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
    counted = counter.get_total_flops() / (b * s)
    assert counted == pytest.approx(flops_per_token(spec), rel=0.01)
    assert total_params(spec) == sum(p.numel() for p in model.parameters())  # the built model's own count


def test_checkpointing_every_second_block_recomputes_half_as_much_as_pytorchs_flop_counter_counts():
    """recompute=full with recompute_every=2 (2 of llama_tiny's 4 blocks checkpointed): the extra FLOPs of the
    recomputed forward, as FlopCounterMode counts a checkpointed step, are the share the plan counts of full's.
    HFU counts the whole block forward, as Megatron's recompute runs it (1.58M FLOPs a token per block here); torch's
    non-reentrant checkpoint stops once every tensor backward needs is back, so a block's last projection, whose
    output nothing saves, does not run again (1.23M): the FLOPs the prediction times, checked here too."""
    from bench.metrics.flops import executed_flops_per_token, hardware_flops_per_token
    from bench.models.model_spec import describe_model
    from bench.parallel.ac import apply_ac
    from bench.spec.layout import Layout

    m = model_cfg("model=llama_tiny")
    spec = typed(ModelConfig, m)  # bench/metrics/flops.py reads a ModelConfig
    counted = {}
    for every in (0, 1, 2):
        model = build_model(typed(ModelConfig, m), 0, "cpu")
        if every:
            apply_ac(model, Layout(1, 1, 1, recompute="full", recompute_every=every))
        x = torch.randint(0, m["vocab_size"], (2, m["seq_len"] + 1))
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
        counted[every] = counter.get_total_flops()
    share = (counted[2] - counted[0]) / (counted[1] - counted[0])
    planned = [hardware_flops_per_token(spec, "full", e) - flops_per_token(spec) for e in (1, 2)]
    assert share == pytest.approx(planned[1] / planned[0], rel=0.01) and share == pytest.approx(0.5, rel=0.01)
    # what the prediction times (executed_flops_per_token): the recomputed forward less each block's last matmul,
    # as the counter counts it; attention's FLOPs in full here (the math kernel computes the masked half too)
    tokens = 2 * m["seq_len"]
    for every in (1, 2):
        executed = (executed_flops_per_token(spec, "full", every) - executed_flops_per_token(spec, "none")
                    + describe_model(spec).causal_skipped_flops_per_token("full", 1 / every)
                    - describe_model(spec).causal_skipped_flops_per_token("none"))
        assert counted[every] - counted[0] == pytest.approx(executed * tokens, rel=0.01)


@pytest.mark.parametrize("name", ["tiny", "llama_tiny"])
def test_op_level_checkpointing_recomputes_the_matmuls_pytorchs_flop_counter_counts(name):
    """recompute=op: the extra FLOPs FlopCounterMode counts in a step are the hardware FLOPs the plan adds (a block's
    even matmuls but its last: k and o_proj, and llama's up projection; gpt's fc_out is never run again), and the
    fused attention kernel runs once per block, as without recomputation (its output is saved).  SDPA's CPU flash
    kernel here: the counter sees the matmuls only (gpt's addmm, llama's mm)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from bench.metrics.flops import hardware_flops_per_token
    from bench.parallel.ac import apply_ac
    from bench.spec.layout import Layout

    class AttentionCalls(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
            return func(*args, **(kwargs or {}))

    m = model_cfg(f"model={name}")
    spec = typed(ModelConfig, m)  # bench/metrics/flops.py reads a ModelConfig
    b, s = 2, m["seq_len"]
    x = torch.randint(0, m["vocab_size"], (b, s + 1))
    counted, attention = {}, {}
    for mode in ("none", "op"):
        model = build_model(typed(ModelConfig, m), 0, "cpu")
        apply_ac(model, Layout(1, 1, 1, recompute=mode))
        with FlopCounterMode(display=False) as counter, AttentionCalls() as calls:
            lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
        counted[mode], attention[mode] = counter.get_total_flops() / (b * s), calls.calls
    assert counted["op"] - counted["none"] == pytest.approx(hardware_flops_per_token(spec, "op") - flops_per_token(spec),
                                                            rel=0.01)
    assert attention == {"none": m["n_layers"], "op": m["n_layers"]}


@pytest.mark.parametrize("seq", [2048, 16384])
def test_attention_flops_grow_with_the_sequence_as_pytorchs_flop_counter_counts(seq):
    """Long sequences (context parallelism's): a one-layer llama-shaped model of d_model 64, batch 1, on the meta
    device (shapes only: FlopCounterMode counts by shape, the same total as on the CPU at 2048; the s x s scores at
    16384 would take GiBs on the CPU).  Attention's 12 L d seq is 77% of the FLOPs a token at 2048, 96% at 16384;
    per token the counter and the formula agree within the norms' 6 FLOPs a parameter (2 x 64 x 6 + 64 x 6)."""
    m = model_cfg("model=llama_tiny", "model.d_model=64", "model.n_heads=2", "model.n_kv_heads=1",
                  "model.n_layers=1", "model.d_ff=176", "model.vocab_size=512", f"model.seq_len={seq}")
    spec = typed(ModelConfig, m)  # bench/metrics/flops.py reads a ModelConfig
    model = build_model(spec, 0, "meta")
    x = torch.randint(0, m["vocab_size"], (1, seq + 1), device="meta")
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
    counted = counter.get_total_flops() / seq
    assert counted == pytest.approx(flops_per_token(spec), rel=1e-3)
    assert flops_per_token(spec) - counted == 3 * 64 * 6  # the three norms' weights: no matmul
    attention = 12 * m["n_layers"] * m["d_model"] * seq
    assert attention / flops_per_token(spec) == pytest.approx({2048: 0.77, 16384: 0.96}[seq], abs=0.01)


def test_the_chunked_loss_runs_the_head_again_as_pytorchs_flop_counter_counts():
    """loss_chunks=4 (bench/models/model.py Head): each chunk's checkpointed head matmul runs again in backward, 2 x d x
    vocab FLOPs a token more than the whole-logits loss, as FlopCounterMode counts both steps; the model FLOPs (MFU's)
    are the same."""
    from bench.metrics.flops import hardware_flops_per_token
    from bench.parallel.ac import apply_loss_chunks

    m = model_cfg("model=llama_tiny")
    spec = typed(ModelConfig, m)  # bench/metrics/flops.py reads a ModelConfig
    x = torch.randint(0, m["vocab_size"], (2, m["seq_len"] + 1))
    counted = {}
    for k in (1, 4):
        model = build_model(typed(ModelConfig, m), 0, "cpu")
        apply_loss_chunks(model, k)
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(x[:, :-1], targets=x[:, 1:]).backward()
        counted[k] = counter.get_total_flops() / x[:, 1:].numel()
    assert counted[4] - counted[1] == hardware_flops_per_token(spec, "none", loss_chunks=4) - flops_per_token(spec)
    assert hardware_flops_per_token(spec, "none", loss_chunks=4) - flops_per_token(spec) == 2 * m["d_model"] * m["vocab_size"]


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_attention_flops_the_prediction_times_apart_are_half_the_counters_batched_matmuls(recompute):
    """The prediction times causal attention at the fused kernel's own rate (bench/machine/hardware.py DEFAULT_ATTENTION):
    the FLOPs it takes out of the matmuls' are half of what FlopCounterMode counts in SDPA's math backend, whose two
    batched matmuls (QK^T, AV, and their gradients) compute the whole s x s where a causal kernel runs its lower
    half; under recompute=full, the recomputed forward's too.  The blocks' Linear layers run as mm, not bmm."""
    from bench.metrics.flops import causal_attention_flops_per_token
    from bench.parallel.ac import apply_ac
    from bench.spec.layout import Layout

    seq = 2048
    m = model_cfg("model=llama_tiny", "model.d_model=64", "model.n_heads=2", "model.n_kv_heads=1",
                  "model.n_layers=2", "model.d_ff=176", "model.vocab_size=512", f"model.seq_len={seq}")
    spec = typed(ModelConfig, m)
    model = build_model(spec, 0, "meta")
    if recompute != "none":
        apply_ac(model, Layout(1, 1, 1, recompute=recompute))
    x = torch.randint(0, m["vocab_size"], (1, seq + 1), device="meta")
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
    batched = counter.get_flop_counts()["Global"][torch.ops.aten.bmm] / seq
    forward, backward = causal_attention_flops_per_token(spec, recompute)
    assert forward + backward == pytest.approx(batched / 2, rel=1e-6)
    assert backward == 4 * m["n_layers"] * m["d_model"] * seq  # the backward's 8 L d s a token, halved
    assert forward == backward / 2 * (2 if recompute == "full" else 1)  # the forward once, or twice under full

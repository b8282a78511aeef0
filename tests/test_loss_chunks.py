"""loss_chunks=k (the loss over k checkpointed chunks of tokens, bench/models/model.py ``Head``): real gloo runs of
llama_tiny whose fp32 losses equal the whole-logits loss of strategy=single, under DDP, FSDP2 (with full
recompute), ZeRO-3 and torch TP, untied and with a tied head (the embedding's weight, which FSDP2 and ZeRO-3 gather
with the embedding).  Two of them also offload every block's saved tensors to host memory (offload_activations,
bench/parallel/ac.py), once over full recompute: that changes where tensors wait, not the loss, and the record
says it ran.  One sweep (tests/conftest.py case_sweep)."""
from __future__ import annotations

import pytest

from bench.metrics.flops import hardware_flops_per_token
from bench.spec.schema import ModelConfig, typed
from tests.conftest import CPU_FAST, case_sweep, metrics_of

LLAMA = [*CPU_FAST, "model=llama_tiny", "steps=2", "model.seq_len=64"]
TIED = ("model.tie_embeddings=true",)
RUNS = {  # run name -> (its overrides, the reference run)
    "single": (("strategy=single",), None),
    "single_tied": (("strategy=single", *TIED), None),
    "ddp_chunks_offload": (("strategy=ddp", "world_size=2", "loss_chunks=4", "offload_activations=true"), "single"),
    "fsdp_chunks_recompute_offload_tied": (("strategy=fsdp", "world_size=2", "loss_chunks=4", "recompute=full",
                                            "offload_activations=true", *TIED), "single_tied"),
    "zero3_chunks": (("strategy=zero", "zero_stage=3", "world_size=2", "loss_chunks=4"), "single"),
    "zero3_chunks_tied": (("strategy=zero", "zero_stage=3", "world_size=2", "loss_chunks=3", *TIED), "single_tied"),
    "tp_chunks": (("strategy=tp", "strategy.impl=torch", "world_size=2", "loss_chunks=4"), "single"),
}


@pytest.mark.slow
def test_chunked_loss_and_offloaded_activations_equal_the_whole_logits_loss_under_every_strategy(tmp_path):
    dirs = case_sweep(tmp_path, {name: o for name, (o, _) in RUNS.items()}, *LLAMA)
    runs = {name: metrics_of(d) for name, d in dirs.items()}
    for name, m in runs.items():
        assert m["status"] == "completed", (name, m.get("error"))
    for name, (overrides, ref) in RUNS.items():
        if ref is None:
            continue
        got, want = runs[name]["loss"]["per_step"], runs[ref]["loss"]["per_step"]
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (name, got, want)
        k = int(dict(o.split("=", 1) for o in overrides)["loss_chunks"])
        assert runs[name]["layout"]["loss_chunks"] == k, (name, runs[name]["layout"])
        offloaded = "offload_activations=true" in overrides
        assert bool(runs[name]["layout"].get("activation_offload")) == offloaded, (name, runs[name]["layout"])
        # the record's hardware FLOPs count the head's forward again (tests/test_flops_reference.py checks the count)
        f, c = runs[name]["flops"], runs[name]["config"]
        assert f["flops_per_token"] == runs[ref]["flops"]["flops_per_token"]
        assert f["hardware_flops_per_token"] == hardware_flops_per_token(typed(ModelConfig, c["model"]), c["recompute"], 1, k)
    assert runs["single"]["loss"]["per_step"] != runs["single_tied"]["loss"]["per_step"]  # two different models

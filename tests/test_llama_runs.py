"""llama_tiny (RMSNorm, SwiGLU, RoPE, grouped-query attention) under every strategy that runs on CPU, with
and without activation recomputation (full, selective, op-level): real gloo runs whose fp32 losses equal strategy=single's.

Every run of this file is one case of one sweep (tests/conftest.py case_sweep: one Hydra process and one
fork server for all of them, each run the one its own command line gives), checked by one test: a
module fixture shared by several tests would be recomputed on every xdist worker that runs one."""
from __future__ import annotations

import pytest

from pathlib import Path

from tests.conftest import CPU_FAST, case_sweep, metrics_of

LLAMA = [*CPU_FAST, "model=llama_tiny", "model.seq_len=64"]  # 64 tokens: no check depends on the length

RUNS = {  # run name -> its overrides (on top of LLAMA)
    "single": ("strategy=single",),
    # activation recomputation on one device
    "single_recompute_full": ("strategy=single", "recompute=full"),
    "single_recompute_selective": ("strategy=single", "recompute=selective"),
    # op-level selective checkpointing (torchtitan's): one device, FSDP2 and ZeRO-2
    "single_recompute_op": ("strategy=single", "recompute=op"),
    "fsdp_recompute_op": ("strategy=fsdp", "world_size=2", "recompute=op"),
    "zero2_recompute_op": ("strategy=zero", "strategy.zero_stage=2", "world_size=2", "recompute=op"),
    # data parallel with full recomputation
    "ddp_recompute_full": ("strategy=ddp", "world_size=2", "recompute=full"),
    "fsdp_recompute_full": ("strategy=fsdp", "world_size=2", "recompute=full"),
    "zero_recompute_full": ("strategy=zero", "world_size=2", "recompute=full"),
    # torch-native tensor and pipeline parallel
    "tp_torch": ("strategy=tp", "strategy.impl=torch", "world_size=2"),
    "pp_torch": ("strategy=pp", "strategy.impl=torch", "world_size=2"),
    # FSDP2 over TP=2: two dimensions
    "fsdp_tp2_recompute_full": ("strategy=fsdp", "strategy.tp=2", "world_size=4", "recompute=full"),
}


def _same(name: str, m: dict, ref: list[float]) -> None:
    assert m["status"] == "completed", (name, m.get("error"))
    got = m["loss"]["per_step"]
    assert max(abs(a - b) for a, b in zip(got, ref)) < 1e-5, (name, got, ref)


def _is_its_run(name: str, m: dict) -> None:
    """The run folder holds the run its overrides ask for (strategy, world size, recomputation, impl, tp)."""
    c, want = m["config"], dict(o.split("=", 1) for o in RUNS[name])
    assert c["model"]["name"] == "llama_tiny", (name, c["model"]["name"])
    assert c["strategy"]["name"] == want["strategy"], (name, c["strategy"]["name"])
    assert c["world_size"] == int(want.get("world_size", 1)), (name, c["world_size"])
    assert c["recompute"] == want.get("recompute", "none"), (name, c["recompute"])
    for key in ("impl", "tp", "zero_stage"):
        if f"strategy.{key}" in want:
            assert str(c["strategy"][key]) == want[f"strategy.{key}"], (name, key, c["strategy"][key])


@pytest.mark.slow
def test_llama_tiny_under_every_cpu_strategy_matches_single(tmp_path):
    """The runs of RUNS, one sweep; each group checked in turn (a failure names its run)."""
    dirs = case_sweep(tmp_path, RUNS, *LLAMA)
    runs = {name: metrics_of(d) for name, d in dirs.items()}
    for name, m in runs.items():
        _is_its_run(name, m)
    ref = runs["single"]
    assert ref["status"] == "completed", ref.get("error")
    llama_single = ref["loss"]["per_step"]
    _recompute_full_and_selective_train_the_same_model(runs, llama_single)
    _op_level_checkpointing_trains_the_same_model(runs, llama_single)
    _data_parallel_strategies_with_full_recompute(runs, llama_single)
    _torch_tensor_and_pipeline_parallel(runs, llama_single)
    _fsdp_over_tensor_parallel_two_dimensions(runs, dirs, llama_single)


def _recompute_full_and_selective_train_the_same_model(runs: dict, llama_single: list[float]) -> None:
    for name in ("single_recompute_full", "single_recompute_selective"):
        m = runs[name]
        _same(name, m, llama_single)
        assert m["layout"]["recompute"].startswith(m["config"]["recompute"]), (name, m["layout"]["recompute"])
        # HFU counts the re-run
        assert m["flops"]["hardware_flops_per_token"] > m["flops"]["flops_per_token"], (name, m["flops"])


def _op_level_checkpointing_trains_the_same_model(runs: dict, llama_single: list[float]) -> None:
    for name in ("single_recompute_op", "fsdp_recompute_op", "zero2_recompute_op"):
        m = runs[name]
        _same(name, m, llama_single)
        assert m["layout"]["recompute"].startswith("op: matmul outputs"), (name, m["layout"]["recompute"])


def _data_parallel_strategies_with_full_recompute(runs: dict, llama_single: list[float]) -> None:
    for name in ("ddp_recompute_full", "fsdp_recompute_full", "zero_recompute_full"):
        _same(name, runs[name], llama_single)


def _torch_tensor_and_pipeline_parallel(runs: dict, llama_single: list[float]) -> None:
    """TP=2 splits the 8 query and 4 key/value heads (and gate/up/down) over 2 ranks; PP=2 splits the blocks."""
    for name in ("tp_torch", "pp_torch"):
        _same(name, runs[name], llama_single)
    plan = runs["tp_torch"]["layout"]["tp_plan"]
    assert "mlp.gate_proj" in plan and "mlp.down_proj" in plan, ("tp_torch", plan)


def _fsdp_over_tensor_parallel_two_dimensions(runs: dict, dirs: dict, llama_single: list[float]) -> None:
    name = "fsdp_tp2_recompute_full"
    m = runs[name]
    _same(name, m, llama_single)
    assert (m["layout"]["tp"], m["layout"]["dp"]) == (2, 2) and "FSDP2" in m["layout"]["dp_reduction"], (name, m["layout"])
    assert Path(dirs[name]).exists()

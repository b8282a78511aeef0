"""Context parallelism (strategy.cp): where it is refused, in one line, before a process starts, and on GPU
that FSDP2 x CP follows single (the ring attention over the sequence shards is PyTorch's; tests/GPU runs are
recorded in results/2026-11-27-h100x4-context-parallel)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bench.spec.layout import Coord, Layout
from tests.conftest import loss_curve, metrics_of

LLAMA = ["model=llama_tiny"]  # sequence 128: 4 chunks of 32 rows at cp=2


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
    (["strategy=fsdp", "strategy.cp=2", "world_size=2", "model.seq_len=192", "dry_run=true",
      "hardware=h100_sxm_80gb"], "divisible by 32 x 2 x cp = 128"),
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
@pytest.mark.parametrize("extra", [[], ["strategy.tp=2"], ["strategy.dp_replicate=2"]])
def test_fsdp_cp_follows_single(bench_run, extra):
    """fp32 (TF32 off): ring attention over two sequence shards and FSDP2 over dp x cp change summation order only.
    With tp=2, or HSDP's two replicas of dp_shard x cp, it needs four GPUs."""
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


# --------------------------------------------------------------------------- the plan, traffic, prediction, planner
def plan_for(*overrides: str):
    from hydra import compose, initialize_config_dir

    from bench.run.config import register_configs, validate
    from tests.conftest import REPO

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=["dry_run=true", *overrides]), gpus=0)


LLAMA8B_32K = ["model=llama3_8b", "strategy=fsdp", "model.seq_len=32768", "world_size=4", "hardware=h100_sxm_80gb",
               "strategy.micro_batch_size=1"]
MIB = 2**20


def test_cp_shards_the_states_over_dp_x_cp_and_holds_a_quarter_of_each_sequence():
    """Four ranks as cp=4 (dp=1) against dp=4: the same sharded states (FSDP2 over dp x cp), each micro-batch's
    activations and logits a quarter (seq_len / cp tokens), plus the ring's K / V beside them."""
    from bench.plan.memory_model import memory_plan
    from bench.costs.traffic import kv_bytes

    cp4, dp4 = plan_for(*LLAMA8B_32K, "strategy.cp=4"), plan_for(*LLAMA8B_32K)
    assert (cp4.layout.dp, cp4.layout.cp, cp4.layout.state_shards) == (1, 4, 4) and dp4.layout.state_shards == 4
    a, b = memory_plan(cp4), memory_plan(dp4)
    assert a["model_states"]["device_mb"] == b["model_states"]["device_mb"]
    assert a["activations"]["per_layer_per_microbatch"] == b["activations"]["per_layer_per_microbatch"] / 4
    assert a["activations"]["logits_mb"] == pytest.approx(b["activations"]["logits_mb"] / 4, abs=0.1)
    assert a["layout"]["cp"] == 4 and "cp" not in b["layout"] and "cp_ring" not in b["activations"]
    # Llama-3 8B's K and V at 32k tokens, 8 kv heads x 128, bf16: 2 x 32768 x 1024 x 2 B = 128 MiB a layer, gathered
    assert kv_bytes(cp4) == 128 * MIB
    assert 128 * MIB < a["activations"]["cp_ring"] < 1024 * MIB


def test_cp_exchanges_k_and_v_over_the_cp_group_and_fsdp_over_dp_x_cp():
    from bench.plan.predict import plan_topology, terms
    from bench.strategies.registry import get_spec
    from bench.costs.traffic import kv_bytes

    p = plan_for(*LLAMA8B_32K, "strategy.cp=4")
    t = get_spec("fsdp").traffic(p, 8e9)
    layers, kv = p.model.n_layers, kv_bytes(p)
    # per layer and micro-batch: K / V gathered in forward and again in backward (3/4 received), dK / dV's fp32 ring
    assert t["context"] == pytest.approx(p.grad_accum * layers * (2 * 0.75 * kv + 2 * kv))
    # FSDP2 gathers over dp x cp = 4 ranks: per micro-batch as over dp = 4 without cp (tests/test_tp_traffic.py counts
    # the gathers themselves against a real step)
    whole = plan_for(*LLAMA8B_32K)
    assert (whole.cp, whole.dp_size, p.dp_size) == (1, 4, 1)
    assert t["param_gather"] / p.grad_accum == pytest.approx(
        get_spec("fsdp").traffic(whole, 8e9)["param_gather"] / whole.grad_accum)
    assert terms(p)["context_s"] > 0 and terms(plan_for(*LLAMA8B_32K))["context_s"] == 0
    where = plan_topology(p).describe()
    assert "cp=4 inside a node" in where and "dp x cp=4 inside a node" in where


def test_cp_group_inside_the_node_the_data_group_across():
    """Rank order tp-cp-dp-pp: on nodes of 4, tp=1 cp=4 dp=2 keeps each cp ring in a node and FSDP2's dp x cp group
    (8 ranks) across both."""
    from bench.machine.hardware import PRESETS
    from bench.plan.topology import topology

    hw = PRESETS["h100_sxm_80gb"]
    from dataclasses import replace

    topo = topology(1, 1, 2, replace(hw, gpus_per_node=4), cp=4)
    assert (topo.groups["cp"].size, topo.groups["cp"].nodes) == (4, 1)
    assert (topo.groups["dp_shard"].size, topo.groups["dp_shard"].nodes) == (8, 2)
    assert topo.bus_gbps("cp") > topo.bus_gbps("dp_shard")
    assert "cp" not in topology(1, 1, 8, hw).as_dict()["groups"]  # named only with context parallelism


def test_dry_run_plans_llama3_8b_at_32k_over_cp4_and_predicts():
    """The command of the brief: global batch 8 on dp = 1 is one micro-batch of 8 sequences by default, which does
    not fit (exit 3: skipped); the dry run then plans the same run with micro_batch_size=auto, which finds the
    micro-batch and recompute that do fit, and prints that setting's prediction as the way out."""
    cmd = [sys.executable, "-m", "bench", *LLAMA8B_32K[:-1], "strategy.cp=4", "dry_run=true"]
    default = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert default.returncode == 3, default.stdout[-2000:]
    plan_line = next(line for line in default.stdout.splitlines() if "plan: model=llama3_8b" in line)
    assert "dp=1 cp=4 micro-batch 8 x 1" in plan_line and "states 29.9" in plan_line  # 16 B x 8.03B / 4
    assert "prediction: none (the plan does not fit" in default.stdout
    way_out = next(line for line in default.stdout.splitlines() if "with strategy.micro_batch_size=auto:" in line)
    assert ("recompute=full" in way_out or "recompute=op" in way_out) and "prediction: " in way_out \
        and "tokens/s" in way_out, way_out
    assert "cp=4 inside a node" in way_out, way_out


def test_planner_finds_context_parallel_layouts_at_32k():
    from bench.planner.cli import plan
    from bench.planner.job import parse

    _, records = plan(parse(["model=llama3_8b", "model.seq_len=32768", "hardware=h100_sxm_80gb", "nodes=1",
                             "gpus_per_node=4", "strategy=fsdp"]))
    fits = [r for r in records if r["verdict"] == "fits"]
    assert fits and fits[0]["cp"] > 1 and any(r["cp"] == 2 for r in fits)
    for r in records:
        assert (f"strategy.cp={r['cp']}" in r["command"]) == (r["cp"] > 1)
        assert r["tp"] * r["cp"] * r["dp"] * r["pp"] == 4 and (r["cp"] == 1 or r["pp"] == 1)


def test_analysis_names_cp_where_it_splits_the_sequence():
    from multirun_analysis import layouts

    lay = {"tp": 1, "pp": 1, "dp": 1, "cp": 4, "micro_batch_size": 2, "grad_accum": 4, "recompute": "full"}
    assert layouts.text(lay) == "tp=1 pp=1 dp=1 cp=4 mb=2x4 rc=full"
    assert layouts.text({**lay, "cp": 1, "dp": 4}) == "tp=1 pp=1 dp=4 mb=2x4 rc=full"  # cp = 1: as before
    ran = layouts.from_record({"config": {"world_size": 4, "strategy": {"name": "fsdp", "cp": 4}},
                               "layout": {"tp": 1, "pp": 1, "cp": 4, "micro_batch_size": 2, "microbatches": 4}})
    assert (ran["cp"], ran["dp"]) == (4, 1)  # dp from the world size: 4 / (tp x pp x cp)
    planned = layouts.from_plan_layout({"strategy": {"name": "fsdp"}}, {"tp": 1, "pp": 1, "dp": 1, "cp": 4})
    assert "cp=4" in layouts.text(planned) and layouts.of_summary_row({"layout_cp": 4.0})["cp"] == 4

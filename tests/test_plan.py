"""The memory plan before launch (bench/memory_model.py): dry_run=true for every strategy (nothing spawned),
predicted OOMs skipped in sweeps without starting a process, and the plan's formulas."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from bench.config import register_configs, validate
from bench.memory_model import memory_plan
from bench.metrics.flops import total_params
from tests.conftest import CPU_FAST, REPO, run_bench

register_configs()
GIB = 2**30


def plan(*overrides: str, gpus: int = 0):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=list(overrides)), gpus=gpus)


CPU_STRATEGIES = {
    "single": ["strategy=single"], "ddp": ["strategy=ddp", "world_size=2"],
    "zero": ["strategy=zero", "zero_stage=3", "world_size=2"], "fsdp": ["strategy=fsdp", "world_size=2"],
    "tp": ["strategy=tp", "strategy.impl=torch", "world_size=2"],
    "pp": ["strategy=pp", "strategy.impl=torch", "world_size=2"],
}


@pytest.mark.parametrize("name", list(CPU_STRATEGIES))
def test_dry_run_prints_and_writes_the_plan_and_spawns_nothing(name, tmp_path):
    d = tmp_path / "r"
    p = run_bench(*CPU_FAST, "dry_run=true", "model=llama_tiny", *CPU_STRATEGIES[name], run_dir=d, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "plan: model=llama_tiny" in out and "predicted peak" in out
    plan_json = json.loads((d / "plan.json").read_text())
    mem = plan_json["memory"]
    assert mem["parameters"] == total_params(plan_json["config"]["model"])
    assert mem["predicted_peak_allocated_mb"] > 0 and mem["flops_per_token"] > 0
    assert not (d / "metrics.json").exists() and not list(d.glob("rank*"))  # no run, no rank


def test_megatron_is_planned_without_a_gpu_process():
    """Megatron needs CUDA to run, not to be planned: the plan of a 2-GPU TP layout, from validate alone."""
    mem = memory_plan(plan("strategy=tp", "world_size=2", "device=cuda", "model=llama3_1b", gpus=2))
    assert mem["layout"]["tp"] == 2 and mem["model_states"]["scheme"] == "megatron_mixed"


def test_dry_run_of_a_plan_that_does_not_fit_exits_3(tmp_path):
    p = run_bench(*CPU_FAST, "dry_run=true", "memory_gib=0.05", run_dir=tmp_path / "r", timeout=120)
    assert p.returncode == 3 and "predicted OOM (needs" in p.stdout + p.stderr


def test_sweep_skips_predicted_ooms_without_starting_them(tmp_path):
    d = tmp_path / "sweep"
    p = run_bench(*CPU_FAST, "strategy=ddp", "world_size=2", "memory_gib=0.05,64", run_dir=d, multirun=True,
                  timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "skipped=1" in out and "completed=1" in out
    by = {json.loads((d / j / "metrics.json").read_text())["status"]: d / j for j in ("0", "1")}
    skipped = by["skipped"]
    m = json.loads((skipped / "metrics.json").read_text())
    assert m["error"]["type"] == "PredictedOOM" and "predicted OOM (needs" in m["error"]["message"]
    assert "of 0.05:" in m["error"]["message"]
    assert m["memory"]["plan"]["fits"] is False and not list(skipped.glob("rank*"))
    done = json.loads((by["completed"] / "metrics.json").read_text())
    assert done["memory"]["plan"]["predicted_peak_allocated_mb"] > 0  # predicted beside measured


def test_force_run_runs_a_predicted_oom(tmp_path):
    p = run_bench(*CPU_FAST, "memory_gib=0.05", "force_run=true", run_dir=tmp_path / "r", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]


def test_the_plans_parts_follow_the_layout():
    base = ("model=llama3_8b", "device=cuda", "precision=bf16", "memory_gib=139")
    one = memory_plan(plan(*base, "strategy=single", gpus=1))
    assert one["fits"] is False  # 16 bytes / parameter alone: 128 GB > a 139 GiB H200 with activations
    z3 = memory_plan(plan(*base, "strategy=zero", "zero_stage=3", "world_size=8", gpus=8))
    assert z3["model_states"]["device_mb"]["optimizer"] == pytest.approx(
        one["model_states"]["device_mb"]["optimizer"] * 12 / 8 / 8, rel=0.01)  # mixed 12 B/param / dp vs fp32 8
    full = memory_plan(plan(*base, "strategy=single", "recompute=full", gpus=1))
    assert full["activations"]["activations_mb"] < one["activations"]["activations_mb"] / 5
    sel = memory_plan(plan(*base, "strategy=single", "recompute=selective", gpus=1))
    assert sel["activations"]["activations_mb"] == one["activations"]["activations_mb"]  # fused attention: same
    tp = memory_plan(plan(*base, "strategy=tp", "world_size=2", gpus=2))
    pp = memory_plan(plan(*base, "strategy=pp", "world_size=2", "microbatches=4p", gpus=2))
    assert tp["parameters_on_rank"] < one["parameters_on_rank"] * 0.6
    assert pp["activations"]["microbatches_in_flight"] == 2 and pp["peak_stage"] in ("first", "last")
    # ZeRO-3 holds its whole reduce bucket (DeepSpeed allocates reduce_bucket_size elements at start), in the
    # parameters' dtype, +2 B per element under autocast
    def z3_buffers(*o):
        return memory_plan(plan(*base, "strategy=zero", "zero_stage=3", "world_size=8", *o, gpus=8))["buffers_mb"]
    small = z3_buffers("strategy.reduce_bucket_size=5e7")
    assert z3_buffers() - small == pytest.approx(4.5e8 * 2 / 2**20, abs=1)
    assert z3_buffers("strategy.autocast=true") - z3_buffers("strategy.autocast=true", "strategy.reduce_bucket_size=5e7") \
        == pytest.approx(4.5e8 * 6 / 2**20, abs=1)
    longer = memory_plan(plan(*base, "strategy=single", "model.seq_len=8192", gpus=1))
    assert longer["activations"]["activations_mb"] > 3.5 * one["activations"]["activations_mb"] / 1  # 4x tokens / step

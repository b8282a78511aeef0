"""Planning for hardware the user does not have (``hardware=<preset>``, bench/hardware.py): a dry run on
this CPU machine plans every strategy, Megatron layouts included, in the precision a run there would
use, against that GPU's memory and its node's host memory; a real run must be on that GPU."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from bench.config import register_configs, validate
from bench.hardware import PRESETS
from bench.memory_model import fits, memory_plan
from bench.schema import ConfigError
from tests.conftest import REPO, run_bench

register_configs()

EVERY_LAYOUT = {
    "single": ["strategy=single", "world_size=1"], "ddp": ["strategy=ddp"], "fsdp": ["strategy=fsdp"],
    "fsdp_tp": ["strategy=fsdp", "strategy.tp=2"], "zero3": ["strategy=zero", "zero_stage=3"],
    "zero1": ["strategy=zero", "zero_stage=1"], "megatron_tp8": ["strategy=megatron", "strategy.tp=8"],
    "megatron_tp2_pp2": ["strategy=megatron", "strategy.tp=2", "strategy.pp=2"],
    "tp_torch": ["strategy=tp", "strategy.impl=torch", "strategy.tp=8"],
    "pp_torch": ["strategy=pp", "strategy.impl=torch", "strategy.pp=2", "microbatches=2", "model.tie_embeddings=false"],
}


def planned(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        plan = validate(compose("config", overrides=["dry_run=true", *overrides]), gpus=0)
    return plan, memory_plan(plan)


@pytest.mark.parametrize("name", list(EVERY_LAYOUT))
def test_every_layout_plans_for_a_preset_without_a_gpu(name):
    plan, mem = planned("model=llama3_1b", "world_size=8", "hardware=h100_sxm_80gb", *EVERY_LAYOUT[name])
    assert plan.device == "cuda" and plan.cfg["precision"] == "bf16"  # what a run on that GPU would use
    assert mem["device_memory_gib"] == PRESETS["h100_sxm_80gb"].memory_gib
    assert mem["device_memory_source"] == "hardware=h100_sxm_80gb" and mem["fits"] is not None


def test_the_fit_verdict_follows_the_presets_memory():
    # Llama 3.2 3B under DDP: 16 B/param of states and 8 of DDP's buckets, ~76 GiB (8B's 180 fits no GPU)
    big = planned("model=llama3_3b", "strategy=ddp", "world_size=8", "hardware=h200_141gb")[1]
    small = planned("model=llama3_3b", "strategy=ddp", "world_size=8", "hardware=a100_40gb")[1]
    assert big["needed_mb"] == small["needed_mb"]
    assert big["fits"] is True and small["fits"] is False
    override = planned("model=llama3_3b", "strategy=ddp", "world_size=8", "hardware=h200_141gb",
                       "hardware.memory_gib=40")[1]
    assert override["fits"] is False and override["device_memory_gib"] == 40


def test_offload_is_checked_against_the_presets_host_memory():
    """The planning machine's own RAM (24 GiB here) would call 1.1B ZeRO-3 offload a host OOM on a node."""
    plan, mem = planned("model=1b", "strategy=zero", "zero_stage=3", "strategy.offload_optimizer=cpu",
                        "strategy.offload_param=cpu", "world_size=4", "hardware=rtx_a6000")
    assert mem["host_memory_gib"] == PRESETS["rtx_a6000"].host_memory_gib and mem["host_fits"] is True
    assert fits(mem, plan) is None


def test_a_preset_without_dry_run_is_refused_naming_the_key():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        with pytest.raises(ConfigError) as e:
            validate(compose("config", overrides=["hardware=h100_sxm_80gb"]), gpus=0)
    assert e.value.key == "hardware" and "dry_run=true" in str(e.value)


def test_an_unknown_key_under_hardware_is_refused():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        with pytest.raises(ConfigError) as e:
            validate(compose("config", overrides=["dry_run=true", "hardware=l40s", "+hardware.memroy_gib=1"]), gpus=0)
    assert e.value.key == "hardware.memroy_gib"


def test_the_laptop_command_plans_megatron_with_a_verdict(tmp_path):
    d = tmp_path / "r"
    p = run_bench("model=llama3_8b", "strategy=megatron", "strategy.tp=8", "world_size=8", "dry_run=true",
                  "hardware=h100_sxm_80gb", run_dir=d, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    plan = json.loads((d / "plan.json").read_text())
    assert plan["fits"] is True and plan["config"]["precision"] == "bf16"
    assert plan["memory"]["device_memory_gib"] == PRESETS["h100_sxm_80gb"].memory_gib

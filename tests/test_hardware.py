"""Planning for hardware the user does not have (``hardware=<preset>``, bench/machine/hardware.py): a dry run on
this CPU machine plans every strategy, Megatron layouts included, in the precision a run there would
use, against that GPU's memory and its node's host memory; a real run must be on that GPU."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from bench.run.config import register_configs, validate
from bench.machine.hardware import PRESETS
from bench.plan.memory_model import fits, memory_plan
from bench.spec.schema import ConfigError
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


# --------------------------------------------------------------------------- hardware fields validated like every knob
def refused(*overrides: str, config_dir=None) -> ConfigError:
    """The ConfigError of a composed config (Hydra's overrides and config dirs, as on the command line)."""
    extra = [f"hydra.searchpath=[file://{config_dir}]"] if config_dir else []
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*extra, "dry_run=true", *overrides])
    with pytest.raises(ConfigError) as e:
        validate(cfg, gpus=0)
    return e.value


def check_refuses(section: dict) -> ConfigError:
    from bench.machine.hardware import check

    with pytest.raises(ConfigError) as e:
        check(section)
    return e.value


def _preset(**change) -> dict:
    import dataclasses

    return {**dataclasses.asdict(PRESETS["a100_80gb"]), **change}


@pytest.mark.parametrize("key,value", [
    ("memory_gib", -5), ("memory_gib", 0), ("hbm_gbps", 0), ("intra_node_gbps", -1), ("inter_node_gbps", 0),
    ("gpus_per_node", 0), ("gpus_per_node", 8.5), ("gpus_per_node", True), ("host_memory_gib", -1),
    ("compute_capability", 0), ("memory_gib", "80"), ("intra_node_link", "infiniband"), ("source", "guess"),
    ("nics_per_node", 0), ("nics_per_node", 2.5), ("nic_gbps", -50)])
def test_a_bad_hardware_field_is_refused_naming_it(key, value):
    e = check_refuses(_preset(**{key: value}))
    assert e.key == f"hardware.{key}" and e.value == value and "\n" not in str(e)


@pytest.mark.parametrize("peaks,key", [({"fp32": 19.5, "bf16": 0}, "bf16"), ({"fp32": 19.5, "bf16": 312, "fp8": -1},
                                       "fp8"), ({"bf16": 312}, "fp32"), ({"fp32": None, "bf16": 312}, "fp32"),
                                      ({"fp32": 19.5, "bf16": 312, "int8": 624}, "int8")])
def test_a_bad_peak_is_refused_naming_its_precision(peaks, key):
    assert check_refuses(_preset(peak_tflops=peaks)).key == f"hardware.peak_tflops.{key}"


@pytest.mark.parametrize("drop", ["memory_gib", "peak_tflops", "hbm_gbps", "intra_node_gbps", "intra_node_link",
                                  "gpus_per_node", "host_memory_gib"])
def test_a_section_missing_a_field_is_refused_naming_it(drop):
    section = {k: v for k, v in _preset(name="mine", source="user").items() if k != drop}
    e = check_refuses(section)
    assert e.key == f"hardware.{drop}" and "python -m bench.probe" in str(e)


def test_an_override_through_hydra_is_checked():
    assert refused("hardware=h100_sxm_80gb", "hardware.hbm_gbps=0").key == "hardware.hbm_gbps"


def test_the_issues_command_is_refused_before_anything_runs(tmp_path):
    """`hardware.memory_gib=-5` used to plan and answer "does not fit" (exit 3)."""
    p = run_bench("hardware=h100_sxm_80gb", "hardware.memory_gib=-5", "dry_run=true", run_dir=tmp_path, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "invalid config: hardware.memory_gib=-5" in p.stdout + p.stderr and not (tmp_path / "plan.json").exists()


def _profile(tmp_path, name: str, drop=(), **change) -> str:
    """A user's profile: a YAML in a hardware/ folder of a config dir, from a preset's numbers."""
    from omegaconf import OmegaConf

    body = _preset(name=name, source="user", **change)
    (tmp_path / "hardware").mkdir(exist_ok=True)
    (tmp_path / "hardware" / f"{name}.yaml").write_text(OmegaConf.to_yaml({k: v for k, v in body.items()
                                                                             if k not in drop}))
    return name


def test_a_users_profile_with_a_missing_field_is_refused_and_a_complete_one_plans(tmp_path):
    assert refused(f"hardware={_profile(tmp_path, 'short', drop=('hbm_gbps',))}",
                   config_dir=tmp_path).key == "hardware.hbm_gbps"
    name = _profile(tmp_path, "mine", memory_gib=71.5, inter_node_gbps=None)  # null: not measured
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        plan = validate(compose("config", overrides=[f"hydra.searchpath=[file://{tmp_path}]", f"hardware={name}",
                                                     "dry_run=true", "strategy=ddp", "world_size=8"]), gpus=0)
    assert memory_plan(plan)["device_memory_gib"] == 71.5


def test_fields_set_under_hardware_auto_are_refused_not_ignored():
    """hardware=auto reads the visible device: a field set there would change nothing."""
    assert refused("hardware.memory_gib=70").key == "hardware.memory_gib"


def test_every_preset_passes_and_says_it_is_a_datasheet():
    import dataclasses

    from bench.machine.hardware import check

    for p in PRESETS.values():
        check(dataclasses.asdict(p))
        assert p.source == "datasheet"


def test_a_one_gpu_node_needs_no_intra_node_link():
    """One GPU a node has no peer to measure a link to; with more GPUs the link is required."""
    from bench.machine.hardware import check

    check(_preset(gpus_per_node=1, intra_node_gbps=None, intra_node_link=None))
    assert check_refuses(_preset(gpus_per_node=2, intra_node_gbps=None)).key == "hardware.intra_node_gbps"


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_cpu_run_in_half_precision_says_when_this_cpu_will_crawl(tmp_path, precision):
    """bf16 on an x86 CPU below AVX-512 runs its matmuls in scalar code (docs/development.md): the plan says so,
    naming torch's dispatch level; fp32, or a CPU with half-precision instructions, gets no note."""
    import platform

    import torch

    p = run_bench("device=cpu", f"precision={precision}", "dry_run=true", run_dir=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    level = torch.backends.cpu.get_cpu_capability()
    slow = precision == "bf16" and platform.machine() == "x86_64" and level in ("NO AVX", "AVX2", "DEFAULT")
    out = p.stdout + p.stderr
    assert (f"precision=bf16 on this CPU (torch's dispatch level {level}" in out) == slow, out[-2000:]

"""Composition (Hydra + structured configs) and validation (bench.run.config.validate)."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from bench.run.config import ConfigError, register_configs, validate
from tests.conftest import REPO, run_bench

register_configs()

# Table I of "Distributed Training Strategies on Commodity Hardware" (Akbulut, Chowdhury, Gutierrez)
PAPER_MODELS = {  # d_model, heads, layers, d_ff, seq, global batch
    "10m": (320, 8, 4, 1536, 128, 16), "100m": (768, 12, 12, 3072, 512, 16),
    "300m": (1024, 16, 24, 4096, 1024, 8), "500m": (1280, 20, 24, 5120, 1024, 8),
    "1b": (1536, 24, 36, 6144, 1024, 4),
}


def cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_default_is_tiny_single():
    c = cfg()
    assert (c.model.name, c.strategy.name, c.world_size) == ("tiny", "single", 1)
    plan = validate(c, gpus=0)
    assert (plan.device, plan.backend, plan.dp_size, plan.grad_accum) == ("cpu", "gloo", 1, 1)


@pytest.mark.parametrize("name", sorted(PAPER_MODELS))
def test_paper_model_presets(name):
    m = cfg(f"model={name}").model
    assert (m.d_model, m.n_heads, m.n_layers, m.d_ff, m.seq_len, m.global_batch) == PAPER_MODELS[name]
    assert m.vocab_size == 8000


def test_gpt2_preset_and_overrides():
    m = cfg("model=gpt2", "model.global_batch=64", "model.seq_len=256").model
    assert (m.d_model, m.n_heads, m.n_layers, m.vocab_size, m.seq_len, m.global_batch) == (768, 12, 12, 50257, 256, 64)


def test_ddp_plan_splits_batch_and_accumulates():
    plan = validate(cfg("strategy=ddp", "world_size=2", "strategy.micro_batch_size=2"), gpus=0)
    assert (plan.dp_size, plan.micro_batch_size, plan.grad_accum) == (2, 2, 2)  # tiny: global batch 8
    # one replica: DDP's own knobs are refused (below), accumulation is not: it still runs
    plan = validate(cfg("strategy=ddp", "world_size=1", "strategy.micro_batch_size=2", "tuning=best"), gpus=0)
    assert (plan.dp_size, plan.micro_batch_size, plan.grad_accum) == (1, 2, 4)


@pytest.mark.parametrize("overrides,gpus,key", [
    (["strategy=single", "world_size=2"], 0, "world_size"),
    (["strategy=ddp", "world_size=3"], 0, "model.global_batch"),
    (["warmup_steps=20", "steps=20"], 0, "warmup_steps"),
    (["precision=fp16", "device=cpu"], 0, "precision"),
    (["device=cuda"], 0, "device"),
    (["strategy=ddp", "world_size=4", "device=cuda"], 2, "world_size"),
    (["strategy=ddp", "world_size=2", "strategy.micro_batch_size=3"], 0, "strategy.micro_batch_size"),
    (["precision=fp8"], 0, "precision"),
    (["model.n_heads=3"], 0, "model.n_heads"),
    (["strategy=ddp", "strategy.bucket_cap_mb=0"], 0, "strategy.bucket_cap_mb"),
    (["strategy=ddp", "world_size=1", "strategy.bucket_cap_mb=100"], 0, "strategy.bucket_cap_mb"),  # one replica
    (["strategy=ddp", "world_size=1", "strategy.static_graph=true"], 0, "strategy.static_graph"),
    (["start_method=fork"], 0, "start_method"),
    (["cpu_affinity=numa"], 0, "cpu_affinity"),
    (["metrics.step_timing=cupti"], 0, "metrics.step_timing"),
    (["teardown_timeout_s=0"], 0, "teardown_timeout_s"),
    (["compile=true", "compile_mode=fast"], 0, "compile_mode"),
    (["compile_mode=reduce-overhead"], 0, "compile_mode"),  # without compile=true
    (["allocator=expandable_segments", "device=cpu"], 0, "allocator"),  # a CUDA allocator setting on CPU
    (["offload_activations=true", "compile=true"], 0, "offload_activations"),  # the compiled backward checks strides
    (["offload_activations=true", "strategy=megatron", "hardware=h200_141gb", "dry_run=true"], 0,
     "offload_activations"),  # megatron-core's offload needs Transformer Engine
])
def test_validation_errors_name_key_value_and_fix(overrides, gpus, key):
    with pytest.raises(ConfigError) as e:
        validate(cfg(*overrides), gpus=gpus)
    assert e.value.key == key
    msg = str(e.value)
    assert key in msg and str(e.value.value) in msg


def test_step_timing_error_lists_the_choices():
    with pytest.raises(ConfigError) as e:
        validate(cfg("metrics.step_timing=cupti"), gpus=0)
    assert str(e.value) == "invalid config: metrics.step_timing='cupti': valid: events, sync"
    assert cfg().metrics.step_timing == "events"  # the default since 2026-11-22 (results say which they used)


@pytest.mark.parametrize("override,expect", [
    ("strategy=nope", "there is no strategy option 'nope'"),
    ("model.not_a_key=1", "not_a_key"),
    ("steps=many", "steps"),
])
def test_composition_errors_fail_fast(override, expect, tmp_path):
    p = run_bench(override, run_dir=tmp_path / "r", timeout=60)
    assert p.returncode != 0
    assert expect in p.stderr + p.stdout
    assert not (tmp_path / "r" / "metrics.json").exists()


def test_invalid_run_is_one_clear_line_and_exit_2(tmp_path):
    p = run_bench("strategy=single", "world_size=2", "device=cpu", run_dir=tmp_path / "r", timeout=60)
    assert p.returncode == 2
    out = p.stdout + p.stderr
    assert "invalid config: world_size=2" in out and "Traceback" not in out
    import json
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["status"] == "invalid" and m["throughput"]["tokens_per_s"] is None
    assert not list((tmp_path / "r").glob("rank*.json"))  # nothing was spawned


PRESETS = sorted(str(p.relative_to(REPO / "conf" / "experiment").with_suffix(""))
                 for p in (REPO / "conf" / "experiment").rglob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("choice", ["default", "best"])
def test_a_preset_never_overrides_the_command_lines_tuning(preset, choice):
    """A preset that set ``tuning: best`` as a value beat ``tuning=default`` on the command line (a group choice,
    merged before the preset's values): the run said best and ran best. Presets choose it in their defaults list."""
    composed = cfg(f"+experiment={preset}", f"tuning={choice}")
    assert composed.tuning == choice, f"+experiment={preset} overrides tuning={choice}: choose it as '- override /tuning: X'"


@pytest.mark.parametrize("overrides,value", [
    (["strategy=fsdp", "strategy.pp=2", "world_size=2"], None),  # fsdp over a pipeline, null: one micro-batch
    (["strategy=pp", "strategy.impl=torch", "world_size=2", "microbatches=1"], 1),  # the pp family, the shorthand
    (["strategy=tp", "strategy.impl=torch", "strategy.tp=2", "strategy.pp=2", "world_size=4",
      "strategy.microbatches=1"], 1),
], ids=["fsdp-pp", "pp-shorthand", "tp-pp"])
def test_torch_1f1b_with_fewer_micro_batches_than_stages_is_refused_before_launch(overrides, value):
    """torch's Schedule1F1B raises at setup, in every rank, when micro-batches < stages: validation says it first."""
    with pytest.raises(ConfigError) as e:
        validate(cfg("device=cpu", *overrides), gpus=0)
    assert (e.value.key, e.value.value) == ("strategy.microbatches", value)
    assert "strategy.pp=2" in str(e.value) and 'batch 8: 2 ("p"), 4, 8' in str(e.value), str(e.value)


@pytest.mark.parametrize("overrides", [
    ["strategy=fsdp", "strategy.pp=2", "world_size=2", "microbatches=p"],
    ["strategy=fsdp", "strategy.pp=2", "world_size=2", "strategy.schedule=gpipe"],  # GPipe runs one micro-batch
    ["strategy=pp", "strategy.impl=torch", "world_size=2", "microbatches=2"],
])
def test_torch_pipelines_with_a_micro_batch_per_stage_or_gpipe_are_valid(overrides):
    assert validate(cfg("device=cpu", *overrides), gpus=0).pp == 2


def test_an_inherited_allocator_setting_must_be_the_configs(monkeypatch):
    """allocator=default while the environment turns expandable segments on would record what did not run."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256, expandable_segments:True")
    with pytest.raises(ConfigError) as e:
        validate(cfg("device=cuda", "hardware=h100_sxm_80gb", "dry_run=true"), gpus=1)
    assert e.value.key == "allocator" and "PYTORCH_CUDA_ALLOC_CONF" in str(e.value)
    assert validate(cfg("device=cuda", "hardware=h100_sxm_80gb", "dry_run=true", "allocator=expandable_segments"), gpus=1)

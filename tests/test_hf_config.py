"""model=hf (bench/models/hf_config.py): Hugging Face configs read into bench's model, what cannot be built refused,
and sizes derived from a width changed on the command line.  Parameter counts are checked against the
published counts and against the model bench builds (sum of its parameters' sizes), not the formula."""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import pytest
import torch
from hydra import compose, initialize_config_dir

from bench.run.config import ConfigError, register_configs, validate
from bench.metrics.flops import total_params
from bench.models.model import build_model, lm_loss
from bench.spec.schema import ModelConfig, typed
from tests.conftest import REPO, run_bench

register_configs()
HF = REPO / "tests" / "data" / "hf"
PUBLISHED = {  # parameters as published with the models
    "llama-3.2-1b": 1_235_814_400, "llama-3.1-70b": 70_553_706_496, "qwen2.5-7b": 7_615_616_512,
    "mistral-7b-v0.1": 7_241_732_096, "gpt2": 124_439_808, "gemma-2b": 2_506_172_416,
}
PRESETS = {"llama-3.2-1b": "llama3_1b", "llama-3.1-70b": "llama3_70b", "qwen2.5-7b": "qwen2_5_7b",
           "mistral-7b-v0.1": "mistral_7b"}
SIZES = ("arch", "d_model", "n_heads", "n_kv_heads", "n_layers", "d_ff", "vocab_size", "tie_embeddings",
         "rope_theta", "norm_eps", "qkv_bias", "mlp_act")


def cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def hf_plan(name: str, *overrides: str, explicit=()):
    return validate(cfg("model=hf", f"model.hf_config=tests/data/hf/{name}", *overrides), gpus=0, explicit=explicit)


def built_params(model) -> int:
    """Parameters of the model bench builds (shapes only), a tied head once (a plan's model, or a recorded one)."""
    model = model if isinstance(model, ModelConfig) else typed(ModelConfig, model)
    return sum(p.numel() for p in build_model(model, 0, "meta").parameters())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_config_gives_the_published_parameter_count(name):
    plan = hf_plan(name)
    from bench.plan.memory_model import memory_plan

    assert memory_plan(plan)["parameters"] == built_params(plan.model) == PUBLISHED[name]
    assert plan.model.hf_config_file == f"tests/data/hf/{name}/config.json" and plan.model.name == name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_their_configs(name):
    hf = hf_plan(name).model
    preset = validate(cfg(f"model={PRESETS[name]}"), gpus=0).model
    assert {k: getattr(preset, k) for k in SIZES} == {k: getattr(hf, k) for k in SIZES}
    assert total_params(preset) == PUBLISHED[name]  # built: test_config_gives_the_published_parameter_count


def test_config_file_folder_and_hub_name_in_the_local_cache(tmp_path, monkeypatch):
    snap = tmp_path / "hub" / "models--meta-llama--Llama-3.2-1B" / "snapshots" / "4e20de36"
    snap.mkdir(parents=True)
    shutil.copy(HF / "llama-3.2-1b" / "config.json", snap / "config.json")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    hub = validate(cfg("model=hf", "model.hf_config=meta-llama/Llama-3.2-1B"), gpus=0).model
    assert (hub.name, hub.hf_config_file) == ("Llama-3.2-1B", "meta-llama/Llama-3.2-1B@4e20de36")
    file = hf_plan("llama-3.2-1b/config.json").model
    assert {k: getattr(file, k) for k in SIZES} == {k: getattr(hub, k) for k in SIZES} and file.name == "llama-3.2-1b"
    assert hub.seq_len == 4096  # min(max_position_embeddings 131072, 4096)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_transformers_autoconfig_reads_the_same_model(name):
    """With transformers installed (pip install -e .[hf]) its AutoConfig fills the defaults; the model is the
    one the plain JSON gives."""
    pytest.importorskip("transformers")
    from bench.models.hf_config import convert, read

    path = HF / name / "config.json"
    assert convert(read(path), name) == convert(json.loads(path.read_text()), name)


def test_overrides_win_over_the_config():
    m = hf_plan("llama-3.2-1b", "model.n_layers=2", "model.seq_len=64", "model.vocab_size=8000",
                explicit=["model.n_layers", "model.seq_len", "model.vocab_size"]).model
    assert (m.n_layers, m.seq_len, m.vocab_size, m.n_kv_heads, m.tie_embeddings) == (2, 64, 8000, 8, True)


def test_qwen2_builds_its_qkv_biases_and_counts_them():
    plan = hf_plan("qwen2.5-7b")
    attn = build_model(plan.model, 0, "meta").blocks["0"].attn
    assert [getattr(attn, f"{p}_proj").bias is not None for p in "qkvo"] == [True, True, True, False]
    assert attn.k_proj.bias.shape == (4 * 128,)  # 4 key/value heads of 3584 / 28
    # a small Qwen2-shaped model trains on the CPU, its biases included
    small = hf_plan("qwen2.5-7b", "model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2", "model.d_ff=96",
                    "model.vocab_size=100", "model.n_layers=1", "model.seq_len=16",
                    explicit=["model.d_model", "model.n_heads", "model.n_kv_heads", "model.d_ff", "model.vocab_size"]).model
    model = build_model(small, 0, "cpu")
    assert sum(p.numel() for p in model.parameters()) == total_params(small)
    x = torch.randint(0, 100, (2, 17), generator=torch.Generator().manual_seed(0))
    lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
    assert model.blocks["0"].attn.q_proj.bias.grad.abs().sum() > 0


def test_gemma_gates_with_tanh_gelu():
    """Gemma 2B: one key/value head, heads of 256, GeGLU (transformers runs tanh-GELU whatever its hidden_act says)."""
    m = hf_plan("gemma-2b").model
    assert (m.mlp_act, m.n_kv_heads, m.tie_embeddings, m.seq_len) == ("gelu_tanh", 1, True, 4096)
    mlp = build_model(dataclasses.replace(m, n_layers=1, vocab_size=8, d_model=16, n_heads=2, n_kv_heads=1, d_ff=24),
                      0, "cpu").blocks["0"].mlp
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    ref = mlp.down_proj(torch.nn.functional.gelu(mlp.gate_proj(x), approximate="tanh") * mlp.up_proj(x))
    assert torch.allclose(mlp(x), ref)
    assert _refusal("model.mlp_act=gelu_tanh").key == "model.mlp_act"  # tiny is gpt


def _refusal(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        validate(cfg(*overrides), gpus=0)
    assert "\n" not in str(e.value)
    return e.value


def test_what_bench_cannot_build_is_refused_naming_the_field(tmp_path):
    e = _refusal("model=hf", "model.hf_config=tests/data/hf/mixtral-8x7b")
    assert e.key == "model.hf_config" and "num_local_experts=8" in str(e) and "mixture-of-experts" in str(e)
    # Mistral 7B v0.1's 4096-token window: the same as full attention up to 4096 tokens, refused beyond
    assert hf_plan("mistral-7b-v0.1", "model.seq_len=4096").model.seq_len == 4096
    assert "sliding_window=4096" in str(_refusal("model=hf", "model.hf_config=tests/data/hf/mistral-7b-v0.1",
                                                 "model.seq_len=8192"))
    # Gemma 7B: 16 heads of 256 over hidden 3072, GeGLU
    gemma = json.loads((HF / "llama-3.2-1b" / "config.json").read_text())
    gemma.update(model_type="llama", hidden_size=3072, num_attention_heads=16, num_key_value_heads=16, head_dim=256)
    (tmp_path / "config.json").write_text(json.dumps(gemma))
    assert "head_dim=256" in str(_refusal("model=hf", f"model.hf_config={tmp_path}"))
    (tmp_path / "config.json").write_text(json.dumps({**gemma, "head_dim": 192, "hidden_act": "gelu"}))  # exact GELU
    assert "hidden_act=gelu" in str(_refusal("model=hf", f"model.hf_config={tmp_path}"))
    (tmp_path / "config.json").write_text(json.dumps({**gemma, "head_dim": 192, "model_type": "phi3"}))
    assert "model_type=phi3" in str(_refusal("model=hf", f"model.hf_config={tmp_path}"))


def test_model_hf_needs_a_config_and_a_preset_takes_none():
    assert _refusal("model=hf").key == "model.hf_config"
    assert "model=hf" in str(_refusal("model=tiny", "model.hf_config=tests/data/hf/gpt2"))
    assert "no config.json" in str(_refusal("model=hf", "model.hf_config=no-such-org/no-such-model"))
    assert _refusal("model.qkv_bias=true").key == "model.qkv_bias"  # gpt: biases everywhere already


# ------------------------------------------------------------------------------ a width set on the command line
def test_a_width_set_alone_derives_d_ff_and_says_so(caplog):
    caplog.set_level(logging.INFO, "bench.models.hf_config")
    given = ["model.d_model", "model.n_layers", "model.n_heads"]
    m = validate(cfg("model=tiny", "model.d_model=2560", "model.n_layers=32", "model.n_heads=32"), gpus=0,
                 explicit=given).model
    assert m.d_ff == 10240 and "derived model.d_ff=10240" in caplog.text and "--config-dir" in caplog.text
    # llama at 4096 wide: Llama 2 7B's published intermediate_size, 11008
    assert validate(cfg("model=llama_tiny", "model.d_model=4096", "model.n_heads=32"), gpus=0,
                    explicit=given).model.d_ff == 11008
    # d_ff set too: it stays
    assert validate(cfg("model=tiny", "model.d_model=512", "model.d_ff=700"), gpus=0,
                    explicit=["model.d_model", "model.d_ff"]).model.d_ff == 700


def test_the_command_line_derives_it_too(tmp_path):
    p = run_bench("model=tiny", "model.d_model=2560", "model.n_layers=32", "model.n_heads=32", "dry_run=true",
                  run_dir=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "derived model.d_ff=10240" in p.stderr + p.stdout
    assert "model=tiny (2.56B parameters" in p.stderr + p.stdout  # d 2560 x 32 layers with d_ff 10240


@pytest.mark.slow
def test_llama_3_2_1b_config_runs_at_tiny_depth_on_cpu(bench_run):
    """The config's model, 2 layers deep, trains on the CPU; the vocabulary is cut to 8000 ids (the tokens are
    synthetic) so that the run needs ~2 GiB, not 8: the embedding of 128256 x 2048 is what costs."""
    p, d = bench_run("model=hf", "model.hf_config=tests/data/hf/llama-3.2-1b", "model.n_layers=2",
                     "model.global_batch=2", "model.seq_len=64", "model.vocab_size=8000", "steps=2", "warmup_steps=1")
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((d / "metrics.json").read_text())
    model = m["config"]["model"]
    assert m["status"] == "completed" and model["hf_config_file"] == "tests/data/hf/llama-3.2-1b/config.json"
    assert (model["arch"], model["n_kv_heads"], model["tie_embeddings"], model["d_ff"]) == ("llama", 8, True, 8192)
    assert m["flops"]["total_params"] == built_params(model)
    assert "the loss stays near ln(8000) = 8.99" in p.stderr + p.stdout

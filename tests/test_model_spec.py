"""The model description (bench/models/model_spec.py) against the model bench builds: parameter tensors and norms from
the built modules, the MLP's saved activations from autograd's own saved-tensor hooks, and the rules validation
takes from it (no processes)."""
from __future__ import annotations

import pytest
import torch

from bench.models.model import build_model
from bench.models.model_spec import describe_model
from bench.spec.schema import ConfigError, ModelConfig, typed

SMALL = dict(d_model=64, n_heads=4, n_layers=3, d_ff=192, vocab_size=500, seq_len=16)
FAMILIES = [dict(SMALL), dict(SMALL, tie_embeddings=True),
            dict(SMALL, arch="llama", n_kv_heads=2), dict(SMALL, arch="llama", n_kv_heads=2, qkv_bias=True),
            dict(SMALL, arch="llama", tie_embeddings=True, mlp_act="gelu_tanh")]


@pytest.mark.parametrize("m", FAMILIES, ids=("gpt", "gpt-tied", "llama-gqa", "qwen2-qkv_bias", "gemma-geglu-tied"))
def test_parameter_tensors_and_norms_are_the_built_models(m):
    model, desc = build_model(typed(ModelConfig, m), 0, "meta"), describe_model(typed(ModelConfig, m))
    block = model.blocks["0"]
    assert desc.block_param_tensors() == len(list(block.parameters()))
    assert desc.end_param_tensors() == len(list(model.parameters())) - m["n_layers"] * len(list(block.parameters()))
    assert desc.norm_params_per_block() == sum(p.numel() for n in ("ln_attn", "ln_mlp")
                                               for p in getattr(block, n).parameters())
    assert desc.param_groups()["block"] == sum(p.numel() for p in block.parameters())


def _mlp_saved_per_token(m: dict) -> int:
    """Elements per token of the distinct activations autograd saves in one block's MLP forward (the MLP's
    input and the weights aside): what its backward keeps, measured, not counted by hand."""
    model = build_model(typed(ModelConfig, m), 0, "cpu")
    mlp = model.blocks["0"].mlp
    x = torch.randn(2, 8, m["d_model"], requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in mlp.parameters()} | {x.untyped_storage().data_ptr()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            saved.setdefault(t.untyped_storage().data_ptr(), t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mlp(x)
    return sum(saved.values()) // x[..., 0].numel()


@pytest.mark.parametrize("m", FAMILIES[::2], ids=("gpt", "llama", "geglu"))
def test_the_mlps_saved_activations_are_what_autograd_saves(m):
    """Eager: gpt saves fc_in's output and GELU's (fc_out's input); the gated MLP gate, up, act(gate) and the
    product (down's input)."""
    e = describe_model(typed(ModelConfig, m)).saved_per_token(compiled=False)
    assert e.mlp + e.mlp_down_input == _mlp_saved_per_token(m)


def test_validation_asks_the_description():
    from hydra import compose, initialize_config_dir

    from bench.run.config import register_configs, validate
    from tests.conftest import REPO

    register_configs()

    def refused(*overrides):
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            with pytest.raises(ConfigError) as e:
                validate(compose("config", overrides=["model=tiny", *overrides]), gpus=0)
        return e.value

    assert refused("model.n_kv_heads=2").key == "model.n_kv_heads"  # gpt: no grouped-query attention
    odd = refused("model.arch=llama", "model.d_model=252", "model.n_heads=4", "model.d_ff=688")  # head dim 63
    assert odd.key == "model.n_heads" and "even head dimension" in str(odd)
    with pytest.raises(ConfigError) as e:
        describe_model(typed(ModelConfig, dict(SMALL, arch="mamba")))
    assert e.value.key == "model.arch" and "gpt, llama" in str(e.value)

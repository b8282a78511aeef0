"""model.arch=llama: RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases,
optional tied embeddings, on bench's one model class; the Llama 3 presets; FLOPs / parameter
counts; megatron-core's GPTModel built with the same layout from bench's weights (CPU)."""
from __future__ import annotations

import copy
import math
import os
import types

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bench.run.config import register_configs, validate
from bench.spec.schema import ConfigError, ModelConfig, typed
from bench.metrics import flops
from bench.models.model import GPT, apply_rope, build_model, lm_loss, rope_cos_sin, sdpa_kv
from tests.conftest import REPO, free_port, start_ranks
from tests.megatron_by_hand import grads_as_model, run_virtual_pipeline_by_hand

register_configs()

PUBLISHED = {  # parameters (Hugging Face safetensors metadata / model cards)
    "llama3_1b": 1_235_814_400,  # Llama 3.2 1B
    "llama3_3b": 3_212_749_824,  # Llama 3.2 3B
    "llama3_8b": 8_030_261_248,  # Llama 3.1 8B
}
SMALL = dict(name="s", d_model=64, n_heads=4, n_layers=2, d_ff=176, vocab_size=300, seq_len=16, global_batch=2)


def compose_model(name: str, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        c = compose("config", overrides=[f"model={name}", *overrides])
    return validate(c, gpus=0).cfg["model"]  # the plain record: the tests build variants of it


def llama_tiny(**over) -> dict:
    m = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / "llama_tiny.yaml"))
    m.pop("defaults")
    return {**m, **over}


# --------------------------------------------------------------------------- presets, counts
@pytest.mark.parametrize("name", list(PUBLISHED))
def test_llama3_presets_have_the_published_parameter_count(name):
    m = compose_model(name)
    assert m["arch"] == "llama" and m["seq_len"] == 2048 and m["global_batch"] == 8
    model = build_model(typed(ModelConfig, m), 0, "meta")  # shapes only: no 8B allocation
    n = sum(p.numel() for p in model.parameters())
    assert n == flops.total_params(typed(ModelConfig, m))
    assert abs(n - PUBLISHED[name]) <= 0.01 * PUBLISHED[name], (n, PUBLISHED[name])
    assert n == PUBLISHED[name]  # in fact exact
    assert (model.head.weight is model.tok_emb.weight) == m["tie_embeddings"] == (name != "llama3_8b")
    assert model.pos_emb is None
    assert compose_model(name, "model.seq_len=8192")["seq_len"] == 8192


@pytest.mark.parametrize("arch", ["gpt", "llama"])
@pytest.mark.parametrize("tie", [False, True])
def test_flops_parameter_counts_match_the_module(arch, tie):
    m = {**SMALL, "arch": arch, "tie_embeddings": tie, **({"n_kv_heads": 2} if arch == "llama" else {})}
    model = build_model(typed(ModelConfig, m), 0, "cpu")
    total = sum(p.numel() for p in model.parameters())  # unique: a tied head counted once
    spec = typed(ModelConfig, m)  # bench/metrics/flops.py reads a ModelConfig
    assert flops.total_params(spec) == total
    emb = sum(p.numel() for p in model.tok_emb.parameters())
    pos = sum(p.numel() for p in model.pos_emb.parameters()) if model.pos_emb is not None else 0
    head = model.head.weight.numel()
    # N counts the output projection also when tied (a matmul), never the embedding lookups
    assert flops.matmul_params(spec) == total - emb - pos + (head if tie else 0)
    assert flops.flops_per_token(spec) == 6 * flops.matmul_params(spec) + 12 * 2 * 64 * 16
    if arch == "llama":
        assert not any(n.endswith("bias") for n, _ in model.named_parameters())


def test_llama_tiny_preset_and_initial_loss():
    m = compose_model("llama_tiny")
    assert (m["d_model"], m["n_heads"], m["n_kv_heads"], m["n_layers"], m["d_ff"], m["vocab_size"],
            m["seq_len"], m["global_batch"], m["tie_embeddings"]) == (256, 8, 4, 4, 688, 8000, 128, 8, False)
    assert {k: m[k] for k in llama_tiny()} == llama_tiny()  # the preset's fields; the schema adds defaults
    model = build_model(typed(ModelConfig, m), 0, "cpu")
    assert 5e6 < sum(p.numel() for p in model.parameters()) < 1e7
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, m["vocab_size"], (2, m["seq_len"] + 1), generator=g)
    logits = model(batch[:, :-1])
    # final RMSNorm then N(0, 0.02) head: logits ~ N(0, 0.02^2 d), loss ~ ln V + var / 2
    assert abs(logits.std().item() - 0.02 * math.sqrt(256)) < 0.03
    loss = lm_loss(logits, batch[:, 1:])
    assert abs(loss.item() - math.log(m["vocab_size"])) < 0.15, loss.item()
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    # same seed, same weights; llama init: N(0, 0.02), o_proj / down_proj 0.02/sqrt(2L), norms 1
    again = build_model(typed(ModelConfig, m), 0, "cpu")
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))
    b0 = model.blocks["0"]
    assert abs(b0.mlp.down_proj.weight.std().item() - 0.02 / math.sqrt(8)) < 1e-3
    assert abs(b0.attn.q_proj.weight.std().item() - 0.02) < 1e-3
    assert torch.equal(b0.ln_attn.weight, torch.ones(256)) and torch.equal(model.norm.weight, torch.ones(256))
    assert (b0.attn.k_proj.out_features, b0.attn.q_proj.out_features) == (4 * 32, 256)


def test_llama_module_names():
    """The names the torch TP plan and FSDP wrapping rely on."""
    model = build_model(typed(ModelConfig, llama_tiny(tie_embeddings=True)), 0, "meta")
    names = {n for n, _ in model.named_modules()}
    block = {"ln_attn", "attn", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "ln_mlp", "mlp",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    assert {f"blocks.0.{n}" for n in block} | {"tok_emb", "norm", "head"} <= names
    assert model.head.weight is model.tok_emb.weight and "head.weight" not in dict(model.named_parameters())
    assert isinstance(model.norm, torch.nn.RMSNorm) and isinstance(model.blocks["3"].ln_mlp, torch.nn.RMSNorm)


# --------------------------------------------------------------------------- GQA, RoPE
def test_gqa_equals_attention_with_repeated_kv_heads():
    """A llama with 2 kv heads for 8 query heads computes what a llama with 8 kv heads computes when
    each of its kv heads is the shared head of its group (query head i reads kv head i // 4)."""
    m = {**SMALL, "arch": "llama", "n_heads": 8, "n_kv_heads": 2}
    gqa = build_model(typed(ModelConfig, m), 0, "cpu")
    mha = build_model(typed(ModelConfig, {**m, "n_kv_heads": None}), 0, "cpu")
    hd = 8
    with torch.no_grad():
        for (n, p), q in zip(gqa.named_parameters(), mha.parameters()):
            if n.endswith(("k_proj.weight", "v_proj.weight")):
                q.copy_(p.view(2, hd, -1).repeat_interleave(4, dim=0).reshape(q.shape))
            else:
                q.copy_(p)
    x = torch.randint(0, m["vocab_size"], (2, m["seq_len"]), generator=torch.Generator().manual_seed(0))
    assert (gqa(x) - mha(x)).abs().max().item() < 1e-5
    # SDPA's own GQA (used in half precision) is the same grouping
    q, k, v = torch.randn(2, 8, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    k2, v2, flag = sdpa_kv(q, k, v)
    assert not flag and k2.shape == q.shape
    ref = F.scaled_dot_product_attention(q, k2, v2, is_causal=True)
    assert (F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) - ref).abs().max() < 1e-6
    assert sdpa_kv(q.bfloat16(), k.bfloat16(), v.bfloat16())[2] is True


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rope_scores_depend_on_relative_position_only(theta):
    hd = 32
    cos, sin = rope_cos_sin(64, hd, theta)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(hd, generator=g), torch.randn(hd, generator=g)

    def score(m, n):
        return (apply_rope(q, cos[m], sin[m]) @ apply_rope(k, cos[n], sin[n])).item()

    for m, n in [(5, 2), (9, 9), (3, 40)]:
        for t in (1, 7, 20):
            assert abs(score(m, n) - score(m + t, n + t)) < 1e-4
    assert abs(score(5, 2) - score(6, 2)) > 1e-3  # it does depend on the offset
    assert torch.allclose(apply_rope(q, cos[0], sin[0]), q)  # position 0: identity
    assert abs(apply_rope(q, cos[33], sin[33]).norm() - q.norm()) < 1e-4  # a rotation
    # frequencies 1 / theta^(2i/d) on both halves ("rotate half", not interleaved)
    inv = 1.0 / theta ** (torch.arange(0, hd, 2).double() / hd)
    assert torch.allclose(cos[3].double(), torch.cat([inv, inv]).mul(3).cos(), atol=1e-6)


def test_rope_matches_megatron(monkeypatch):
    """Megatron's RotaryEmbedding (rotary_percent 1, not interleaved) and its unfused bshd apply,
    on q/k in [s, b, heads, head_dim], give bench's rotation."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # get_emb moves inv_freq "to CUDA"
    s, hd, theta = 24, 32, 500000.0
    emb = RotaryEmbedding(kv_channels=hd, rotary_percent=1.0, rotary_interleaved=False, rotary_base=theta,
                          use_cpu_initialization=True, cp_group=None)(s)
    assert emb.shape == (s, 1, 1, hd)
    t = torch.randn(s, 2, 3, hd, generator=torch.Generator().manual_seed(0))
    got = _apply_rotary_pos_emb_bshd(t, emb, rotary_interleaved=False)
    cos, sin = rope_cos_sin(s, hd, theta)
    want = apply_rope(t.permute(1, 2, 0, 3), cos, sin).permute(2, 0, 1, 3)  # bench: [b, heads, s, hd]
    assert (got - want).abs().max().item() < 1e-6


def test_pipeline_stages_of_a_llama_compute_the_whole_model():
    """A stage is GPT with parts deleted (as torch_pp.stage_module): RoPE travels with the blocks."""
    m = llama_tiny(tie_embeddings=True, n_layers=2, seq_len=32)
    full = build_model(typed(ModelConfig, m), 0, "cpu")
    stages = []
    for first, keys in ((True, ["0"]), (False, ["1"])):
        st = GPT.__new__(GPT)
        torch.nn.Module.__init__(st)
        st.tok_emb, st.pos_emb = (full.tok_emb if first else None), None
        st.blocks = torch.nn.ModuleDict({k: full.blocks[k] for k in keys})
        st.norm, st.head = (None, None) if first else (full.norm, full.head)
        stages.append(st)
    x = torch.randint(0, m["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(0))
    assert torch.equal(stages[1](stages[0](x)), full(x))


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("overrides, key", [
    (["model.arch=mamba"], "model.arch"),
    (["model=llama_tiny", "model.n_kv_heads=3"], "model.n_kv_heads"),
    (["model=llama_tiny", "model.n_kv_heads=0"], "model.n_kv_heads"),
    (["model.n_kv_heads=2"], "model.n_kv_heads"),  # tiny is gpt: no GQA
    (["model=llama_tiny", "model.n_heads=16", "model.n_kv_heads=4", "model.d_model=240"], "model.n_heads"),  # hd 15
    (["model=llama_tiny", "model.rope_theta=0"], "model.rope_theta"),
    (["model=llama_tiny", "model.norm_eps=-1"], "model.norm_eps"),
])
def test_llama_config_rules(overrides, key):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        c = compose("config", overrides=overrides)
    with pytest.raises(ConfigError) as e:
        validate(c, gpus=0)
    assert e.value.key == key


def test_gpt_may_tie_and_keeps_its_defaults():
    m = compose_model("tiny", "model.tie_embeddings=true", "model.n_kv_heads=4")  # n_kv_heads == n_heads: fine
    model = build_model(typed(ModelConfig, m), 0, "cpu")
    assert model.head.weight is model.tok_emb.weight and model.pos_emb is not None
    d = compose_model("tiny")
    assert (d["arch"], d["n_kv_heads"], d["tie_embeddings"], d["rope_theta"], d["norm_eps"]) == \
        ("gpt", None, False, 500000.0, 1e-5)


# --------------------------------------------------------------------------- Megatron
def _fake_chunk(n_layers: int):
    """What bench_tensor_for reads of a chunk: its layers' global 1-based layer numbers."""
    layers = [types.SimpleNamespace(layer_number=j + 1) for j in range(n_layers)]
    return types.SimpleNamespace(decoder=types.SimpleNamespace(layers=layers))


@pytest.mark.parametrize("tp", [2, 4])
def test_megatron_tp_slices_of_bench_llama_weights(tp):
    """Each TP rank's linear_qkv slice is Megatron's [ng/tp groups x (q heads of the group, k, v)]
    holding exactly bench's column shards of q/k/v_proj (the query and kv heads torch-native TP puts
    on that rank); linear_fc1 is [gate shard; up shard]; the slices rebuild the full fused tensors."""
    from bench.strategies.megatron import model as mm

    m = llama_tiny(n_layers=1)
    bench = build_model(typed(ModelConfig, m), 0, "cpu")
    chunk, attn, mlp = _fake_chunk(1), bench.blocks["0"].attn, bench.blocks["0"].mlp
    nh, ng, hd, d = m["n_heads"], m["n_kv_heads"], 32, m["d_model"]

    def sl(name, r):
        return mm.bench_tensor_for(f"decoder.layers.0.{name}", chunk, bench, nh, r, tp)

    qkv = [sl("self_attention.linear_qkv.weight", r) for r in range(tp)]
    full = torch.cat(qkv)
    assert full.shape == ((nh + 2 * ng) * hd, d)
    groups = full.view(ng, (nh // ng + 2) * hd, d)
    for g in range(ng):  # layout per query group: [q heads of g; k_g; v_g]
        q, k, v = groups[g].split([nh // ng * hd, hd, hd])
        assert torch.equal(q, attn.q_proj.weight[g * nh // ng * hd:(g + 1) * nh // ng * hd])
        assert torch.equal(k, attn.k_proj.weight[g * hd:(g + 1) * hd])
        assert torch.equal(v, attn.v_proj.weight[g * hd:(g + 1) * hd])
    for r in range(tp):  # as Megatron splits a rank's slice: ng/tp groups
        local = qkv[r].view(ng // tp, (nh // ng + 2) * hd, d)
        q, k, v = local.split([nh // ng * hd, hd, hd], dim=1)
        assert torch.equal(q.reshape(-1, d), attn.q_proj.weight.chunk(tp)[r])
        assert torch.equal(k.reshape(-1, d), attn.k_proj.weight.chunk(tp)[r])
        assert torch.equal(v.reshape(-1, d), attn.v_proj.weight.chunk(tp)[r])
        fc1 = sl("mlp.linear_fc1.weight", r)
        gate, up = torch.chunk(fc1, 2, dim=0)  # Megatron's glu: chunk(2, dim=-1) of the local output
        assert torch.equal(gate, mlp.gate_proj.weight.chunk(tp)[r]) and torch.equal(up, mlp.up_proj.weight.chunk(tp)[r])
        assert torch.equal(sl("mlp.linear_fc2.weight", r), mlp.down_proj.weight.chunk(tp, dim=1)[r])
        assert torch.equal(sl("self_attention.linear_proj.weight", r), attn.o_proj.weight.chunk(tp, dim=1)[r])
        assert torch.equal(sl("input_layernorm.weight", r), bench.blocks["0"].ln_attn.weight)
        assert torch.equal(sl("self_attention.linear_qkv.layer_norm_weight", r), bench.blocks["0"].ln_attn.weight)
    tied = build_model(typed(ModelConfig, llama_tiny(n_layers=1, tie_embeddings=True)), 0, "cpu")
    out = torch.cat([mm.bench_tensor_for("output_layer.weight", chunk, tied, nh, r, tp) for r in range(tp)])
    assert torch.equal(out, tied.tok_emb.weight)


def _megatron_llama_worker(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # Megatron's RotaryEmbedding.get_emb moves its frequencies "to CUDA": keep them on the CPU
    torch.cuda.current_device = lambda: "cpu"
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state as ps

    from bench.strategies.megatron import model as mm

    g = torch.Generator().manual_seed(1)
    for tie in (False, True):
        mc = llama_tiny(tie_embeddings=tie)
        L, V, s = mc["n_layers"], mc["vocab_size"], mc["seq_len"]
        bench = build_model(typed(ModelConfig, mc), 0, "cpu")
        batch = torch.randint(0, V, (2, s + 1), generator=g)
        x, y = batch[:, :-1], batch[:, 1:]
        pos = torch.arange(s).expand(2, -1)
        logits = bench(x)
        ref = lm_loss(logits, y)
        ref.backward()
        bench_grads = grads_as_model(bench)

        # TP = 2 (2 of the 4 query groups per rank): logits, loss and every gradient equal bench's
        ps.initialize_model_parallel(tensor_model_parallel_size=2, create_gloo_process_groups=False)
        cfg = mm.transformer_config(typed(ModelConfig, mc), tp=2, precision="fp32", use_cpu_initialization=True)
        assert (cfg.normalization, cfg.gated_linear_unit, cfg.num_query_groups, cfg.add_bias_linear,
                cfg.layernorm_epsilon, cfg.rotary_interleaved) == ("RMSNorm", True, 4, False, 1e-5, False)
        (chunk,) = mm.build_chunks(cfg, typed(ModelConfig, mc), "sdpa")
        assert chunk.position_embedding_type == "rope" and chunk.rotary_pos_emb.inv_freq.shape == (16,)
        assert isinstance(chunk.decoder.layers[0].input_layernorm, mm.RMSNorm)
        assert isinstance(chunk.decoder.final_layernorm, mm.RMSNorm)
        tp_rank = ps.get_tensor_model_parallel_rank()
        assert mm.load_bench_weights(chunk, bench, mc["n_heads"], tp_rank, 2) == (2 if tie else 3) + 6 * L
        assert (chunk.output_layer.weight is None) == tie
        with torch.no_grad():
            out = chunk(x, pos, None)  # [b, s, V / tp]: this rank's vocab shard
        assert (out - logits.detach().chunk(2, dim=-1)[tp_rank]).abs().max().item() < 1e-5
        loss = chunk(x, pos, None, labels=y).mean()
        assert abs(loss.item() - ref.item()) < 1e-5, (tie, loss.item(), ref.item())
        loss.backward()
        for name, p in chunk.named_parameters():
            want = mm.bench_tensor_for(name, chunk, bench_grads, mc["n_heads"], tp_rank, 2)
            assert (p.grad - want).abs().max().item() < 1e-5, (tie, name)
        ps.destroy_model_parallel()

    # PP = 2 x 2 virtual stages (untied; a tied output layer on the last stage is set up through
    # a CUDA all-reduce): run the chunks in pipeline order by hand; RoPE on every stage
    mc = llama_tiny()
    bench = build_model(typed(ModelConfig, mc), 0, "cpu")
    batch = torch.randint(0, mc["vocab_size"], (2, mc["seq_len"] + 1), generator=g)
    x, y = batch[:, :-1], batch[:, 1:]
    pos = torch.arange(mc["seq_len"]).expand(2, -1)
    with torch.no_grad():
        ref = lm_loss(bench(x), y)
    ps.initialize_model_parallel(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                                 create_gloo_process_groups=False)
    cfg = mm.transformer_config(typed(ModelConfig, mc), pp=2, virtual_pipeline=2, precision="fp32",
                                use_cpu_initialization=True)
    chunks = mm.build_chunks(cfg, typed(ModelConfig, mc), "sdpa")
    for c in chunks:
        mm.load_bench_weights(c, bench, mc["n_heads"], 0, 1)
    out = run_virtual_pipeline_by_hand(chunks, x, pos, y, mc["d_model"], rank)
    if rank == 1:
        assert abs(out - ref.item()) < 1e-5, (out, ref.item())
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def test_megatron_llama_on_cpu_matches_bench():
    """Megatron's GPTModel with bench's llama layout (RMSNorm, SwiGLU, RoPE, 4 query groups, no
    biases; tied and untied) from bench's weights: TP=2 logits, loss and gradients, and PP=2 x 2
    virtual stages' loss equal bench's llama_tiny (fp32, CPU, gloo)."""
    start_ranks(_megatron_llama_worker, (2, free_port()), 2)


# --------------------------------------------------------------------------- torch-native TP
LLAMA_TP_PLAN = {  # bench.strategies.torch_tp's plan with the llama MLP's names
    "attn.q_proj": "col", "attn.k_proj": "col", "attn.v_proj": "col", "attn.o_proj": "row",
    "mlp.gate_proj": "col", "mlp.up_proj": "col", "mlp.down_proj": "row",
}


def _torch_tp_llama_worker(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   parallelize_module)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    mc = llama_tiny(tie_embeddings=True, seq_len=32)
    ref = build_model(typed(ModelConfig, mc), 0, "cpu")
    model = copy.deepcopy(ref)
    plan = {k: ColwiseParallel() if v == "col" else RowwiseParallel() for k, v in LLAMA_TP_PLAN.items()}
    plan["attn"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                      use_local_output=False)
    for block in model.blocks.values():
        parallelize_module(block, mesh, plan)
    attn = model.blocks["0"].attn
    assert attn.q_proj.weight.to_local().shape[0] == 256 // world  # 8 / tp query heads
    assert attn.k_proj.weight.to_local().shape[0] == 128 // world  # 4 / tp kv heads
    batch = torch.randint(0, mc["vocab_size"], (2, 33), generator=torch.Generator().manual_seed(1))
    x, y = batch[:, :-1], batch[:, 1:]
    loss, want = lm_loss(model(x), y), lm_loss(ref(x), y)
    assert abs(loss.item() - want.item()) < 1e-5, (loss.item(), want.item())
    loss.backward()
    want.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).sub(q.grad).abs().max() < 1e-5, name
    dist.destroy_process_group()


def test_torch_tp_of_llama_matches_unsharded():
    """torch-native TP=2 over the llama module names (q/k/v_proj, gate/up_proj column-wise,
    o_proj/down_proj row-wise; RoPE and GQA on the local heads): loss and gradients of the
    unsharded model (tied embeddings replicated)."""
    start_ranks(_torch_tp_llama_worker, (2, free_port()), 2)

"""Megatron-core's GPTModel with bench's model dims (imports megatron.core: import lazily).

* TransformerConfig: bench's d_model / n_heads / n_layers / d_ff, no dropout, N(0, 0.02) init
  with 1/sqrt(2L)-scaled output projections, no fusions that need apex / TE / CUDA extensions;
  model.arch=gpt: LayerNorm, tanh-approximate GELU, biases on every linear;
  model.arch=llama: RMSNorm, SwiGLU (gated_linear_unit, silu), num_query_groups = n_kv_heads,
  no biases; both: eps = model.norm_eps.
* GPTModel: gpt: learned absolute position embeddings; llama: RoPE (rotary_base = rope_theta,
  rotary_percent 1, not interleaved, no rope scaling); output layer tied to the word embedding
  when model.tie_embeddings (with pipeline parallelism Megatron keeps a copy on the last stage,
  synced through its embedding group); vocab split over TP.
* Layer spec without Transformer Engine (``spec=sdpa``): Megatron's local spec with its core
  attention replaced by :class:`SDPACoreAttention` (torch scaled_dot_product_attention; the
  stock DotProductAttention materialises the [b, h, s, s] scores, ~2.5x slower end to end),
  and a torch LayerNorm / RMSNorm that also works under sequence parallelism (:class:`LayerNorm`,
  :class:`RMSNorm`); ``spec=local`` keeps Megatron's DotProductAttention; ``spec=te`` is
  Megatron's TE spec (its norms follow config.normalization).
* :func:`load_bench_weights` copies bench's initialisation (bench.models.model.build_model) into a
  (TP-sharded, PP-split) Megatron chunk, so every layout starts from the weights of
  strategy=single.  Megatron's fused layouts (megatron-core 0.16.1): ``linear_qkv`` holds, per
  query group g, [the n_heads/n_kv_heads query heads of g; k_g; v_g] (SelfAttention.
  get_query_key_value_tensors views it as [.., ng, (np/ng + 2) * hn] and splits q, k, v), split
  over TP in contiguous rows (ColumnParallelLinear); gated ``linear_fc1`` holds on each TP rank
  [gate shard; up shard] (MLP.forward's glu: torch.chunk(x, 2, dim=-1), activation on the first
  half; apply_swiglu_sharded_factory).

Everything here builds on CPU too (``use_cpu_initialization=True``; used by the CPU tests);
the strategy builds on GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig

from bench.models.model import DTYPES, sdpa_kv
from bench.spec.schema import ModelConfig



class SDPACoreAttention(MegatronModule):
    """Core attention through ``torch.nn.functional.scaled_dot_product_attention``.

    Megatron builds it with keyword arguments (config, layer_number, attn_mask_type,
    attention_type, cp_comm_type, softmax_scale, pg_collection) and calls it with q/k/v of
    shape [s, b, heads, head_dim] (views of the fused QKV output); it returns
    [s, b, heads * head_dim]."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: Optional[AttnMaskType] = None,
                 attention_type: str = "self", attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None, pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPACoreAttention does not support context parallelism")
        self.layer_number = layer_number
        self.attn_mask_type = attn_mask_type if attn_mask_type is not None else AttnMaskType.causal
        self.softmax_scale = softmax_scale  # None: 1/sqrt(head_dim), as Megatron
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPACoreAttention: packed sequences / attention bias are not supported")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = mask_type == AttnMaskType.causal
        s, b = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, head_dim]
        mask = None if causal or attention_mask is None else ~attention_mask  # Megatron: True = masked out
        p = self.dropout_p if self.training else 0.0
        k, v, gqa = sdpa_kv(q, k, v)  # as bench's attention: SDPA's GQA in half precision, else k/v repeated
        if p > 0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                                                     scale=self.softmax_scale, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                                                 scale=self.softmax_scale, enable_gqa=gqa)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


class _MegatronNorm:
    """Megatron's norm constructor for a torch norm class (mixed in before it); under sequence
    parallelism the parameters carry ``sequence_parallel=True`` so finalize_model_grads
    all-reduces their gradients over TP (Megatron's stock torch-norm wrapper refuses sequence
    parallelism)."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_unused):
        device = None if config.use_cpu_initialization or not torch.cuda.is_available() \
            else torch.cuda.current_device()
        super().__init__(hidden_size, eps=eps, device=device, dtype=config.params_dtype)
        for p in self.parameters():
            setattr(p, "sequence_parallel", config.sequence_parallel)


class LayerNorm(_MegatronNorm, torch.nn.LayerNorm):
    """torch LayerNorm with Megatron's constructor; under sequence parallelism its parameters
    carry ``sequence_parallel=True`` so finalize_model_grads all-reduces their gradients over
    TP (Megatron's stock torch-norm wrapper refuses sequence parallelism)."""


class RMSNorm(_MegatronNorm, torch.nn.RMSNorm):
    """torch RMSNorm (what bench's llama uses) with Megatron's constructor; parameters marked
    ``sequence_parallel`` as :class:`LayerNorm`'s."""


NORMS = {"LayerNorm": LayerNorm, "RMSNorm": RMSNorm}


# bench's recompute -> Megatron's: full = every layer checkpointed (uniform, 1 layer per group), selective =
# the core attention recomputed (Megatron's default selective module)
RECOMPUTE = {"none": {}, "full": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
             "selective": dict(recompute_granularity="selective")}


def transformer_config(model_cfg: ModelConfig, *, tp: int = 1, pp: int = 1, virtual_pipeline: int = 1,
                       sequence_parallel: bool = False, precision: str = "bf16",
                       use_cpu_initialization: bool = False, perform_initialization: bool = True,
                       batch_p2p_sync: bool = True, timeout_s: int = 600, recompute: str = "none") -> TransformerConfig:
    dtype = DTYPES[precision]
    if model_cfg.arch == "llama":
        # bench's llama: pre-RMSNorm, SwiGLU, grouped-query attention, no biases (RoPE: GPTModel)
        arch = dict(normalization="RMSNorm", add_bias_linear=False, add_qkv_bias=False, gated_linear_unit=True,
                    activation_func=F.silu, num_query_groups=model_cfg.n_kv_heads or model_cfg.n_heads)
    else:
        # bench's GPT: pre-LN, tanh GELU, biases
        arch = dict(normalization="LayerNorm", add_bias_linear=True,
                    activation_func=functools.partial(F.gelu, approximate="tanh"))
    return TransformerConfig(
        num_layers=model_cfg.n_layers, hidden_size=model_cfg.d_model,
        num_attention_heads=model_cfg.n_heads, ffn_hidden_size=model_cfg.d_ff,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=virtual_pipeline if virtual_pipeline > 1 else None,
        sequence_parallel=sequence_parallel,
        **arch, layernorm_epsilon=model_cfg.norm_eps,
        # no dropout, GPT-2 init
        hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02,
        # precision, the Megatron way: model in bf16/fp16 (Float16Module), fp32 master weights in
        # the optimizer; fp32 runs everything in fp32
        bf16=precision == "bf16", fp16=precision == "fp16", params_dtype=dtype, pipeline_dtype=dtype,
        # no fusions that need apex / TE / CUDA extensions
        gradient_accumulation_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
        cross_entropy_loss_fusion=False,
        deallocate_pipeline_outputs=pp > 1,
        # Megatron-LM's p2p settings: overlapped, unbatched send/recv for the interleaved schedule,
        # batched otherwise.  (Batched p2p in the interleaved schedule with pp = 2, where the next
        # and previous stage are the same rank, fed micro-batches >= pp the wrong activations:
        # seen on 2 H200s with megatron-core 0.16.1.)
        overlap_p2p_comm=virtual_pipeline > 1, batch_p2p_comm=virtual_pipeline == 1,
        batch_p2p_sync=batch_p2p_sync,
        use_cpu_initialization=use_cpu_initialization, perform_initialization=perform_initialization,
        **RECOMPUTE[recompute],
    )


def resolve_spec(spec: str) -> str:
    """``auto`` -> ``te`` when transformer_engine imports, else ``sdpa``."""
    if spec != "auto":
        return spec
    try:
        import transformer_engine  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
        return "te"
    except Exception:
        return "sdpa"


def layer_spec(kind: str, normalization: str = "LayerNorm") -> ModuleSpec:
    """The transformer-layer ModuleSpec: ``sdpa`` | ``local`` | ``te``; ``normalization``
    (config.normalization: LayerNorm | RMSNorm) picks the torch norm of sdpa / local."""
    if kind == "te":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec()
    if kind not in ("sdpa", "local"):
        raise ValueError(f"unknown layer spec {kind!r}")
    norm = NORMS[normalization]
    spec = get_gpt_layer_local_spec()
    sub = spec.submodules
    attn = sub.self_attention
    if kind == "sdpa":
        attn = dataclasses.replace(attn, submodules=dataclasses.replace(attn.submodules,
                                                                        core_attention=SDPACoreAttention))
    return dataclasses.replace(spec, submodules=dataclasses.replace(
        sub, input_layernorm=norm, pre_mlp_layernorm=norm, self_attention=attn))


def block_spec(config: TransformerConfig, kind: str, vp_stage: Optional[int], pp_rank: int):
    """The decoder-block spec of one model chunk: its layers and the final norm."""
    if kind == "te":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

        return get_gpt_decoder_block_spec(config, use_transformer_engine=True, vp_stage=vp_stage, pp_rank=pp_rank)
    n = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    return TransformerBlockSubmodules(layer_specs=[layer_spec(kind, config.normalization)] * n,
                                      layer_norm=NORMS[config.normalization])


def build_chunks(config: TransformerConfig, model_cfg: ModelConfig, kind: str) -> list[GPTModel]:
    """This rank's model chunks (one per virtual pipeline stage), parallel_state initialised."""
    v = config.virtual_pipeline_model_parallel_size or 1
    pp_rank = ps.get_pipeline_model_parallel_rank()
    if model_cfg.arch == "llama":  # plain RoPE on every head dim, "rotate half" (not interleaved)
        pos = dict(position_embedding_type="rope", rotary_percent=1.0,
                   rotary_base=model_cfg.rope_theta, rope_scaling=False)
    else:
        pos = dict(position_embedding_type="learned_absolute")
    chunks = []
    for i in range(v):
        vp = i if v > 1 else None
        chunks.append(GPTModel(
            config=config, transformer_layer_spec=block_spec(config, kind, vp, pp_rank),
            vocab_size=model_cfg.vocab_size, max_sequence_length=model_cfg.seq_len,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            parallel_output=True, share_embeddings_and_output_weights=bool(model_cfg.tie_embeddings),
            **pos, vp_stage=vp))
    return chunks


# --------------------------------------------------------------------------- bench weights
def _qkv(attn, what: str, n_heads: int) -> torch.Tensor:
    """bench's separate q/k/v weights (or biases) in Megatron's fused layout: per query group g
    (ng = n_kv_heads groups of n_heads / ng query heads; gpt: ng = n_heads)
    [q heads of g; k_g; v_g], groups in order.  bench's query head i belongs to group
    i // (n_heads / ng), as in SDPA's GQA."""
    q, k, v = (getattr(getattr(attn, f"{x}_proj"), what) for x in "qkv")
    hd = q.shape[0] // n_heads
    ng = k.shape[0] // hd
    groups = [q.reshape(ng, (n_heads // ng) * hd, *q.shape[1:]), k.reshape(ng, hd, *k.shape[1:]),
              v.reshape(ng, hd, *v.shape[1:])]
    return torch.cat(groups, dim=1).reshape(q.shape[0] + k.shape[0] + v.shape[0], *q.shape[1:])


def _fc1(mlp, what: str, tp_rank: int, tp: int) -> torch.Tensor:
    """linear_fc1's slice on tp_rank: gpt: fc_in's rows; llama (gated): [gate shard; up shard]."""
    if hasattr(mlp, "gate_proj"):
        return torch.cat([getattr(getattr(mlp, x), what).chunk(tp, dim=0)[tp_rank] for x in ("gate_proj", "up_proj")])
    return getattr(mlp.fc_in, what).chunk(tp, dim=0)[tp_rank]


def _fc2(mlp, what: str) -> torch.Tensor:
    return getattr(mlp.down_proj if hasattr(mlp, "down_proj") else mlp.fc_out, what)


_LAYER_MAP = {  # Megatron name inside decoder.layers.<j>. -> (bench part, TP split)
    "input_layernorm.weight": ("ln_attn.weight", None),
    "input_layernorm.bias": ("ln_attn.bias", None),
    "self_attention.linear_qkv.layer_norm_weight": ("ln_attn.weight", None),  # TE: LN fused into QKV
    "self_attention.linear_qkv.layer_norm_bias": ("ln_attn.bias", None),
    "self_attention.linear_qkv.weight": ("qkv.weight", 0),
    "self_attention.linear_qkv.bias": ("qkv.bias", 0),
    "self_attention.linear_proj.weight": ("attn.o_proj.weight", 1),
    "self_attention.linear_proj.bias": ("attn.o_proj.bias", None),  # row-parallel bias: full
    "pre_mlp_layernorm.weight": ("ln_mlp.weight", None),
    "pre_mlp_layernorm.bias": ("ln_mlp.bias", None),
    "mlp.linear_fc1.layer_norm_weight": ("ln_mlp.weight", None),  # TE: LN fused into fc1
    "mlp.linear_fc1.layer_norm_bias": ("ln_mlp.bias", None),
    "mlp.linear_fc1.weight": ("fc1.weight", "fc1"),  # gpt: fc_in; llama: [gate; up] per TP rank
    "mlp.linear_fc1.bias": ("fc1.bias", "fc1"),
    "mlp.linear_fc2.weight": ("fc2.weight", 1),  # gpt: fc_out; llama: down_proj
    "mlp.linear_fc2.bias": ("fc2.bias", None),
}
_TOP_MAP = {
    "embedding.word_embeddings.weight": ("tok_emb.weight", 0),  # vocab split over TP
    "embedding.position_embeddings.weight": ("pos_emb.weight", None),
    "decoder.final_layernorm.weight": ("norm.weight", None),
    "decoder.final_layernorm.bias": ("norm.bias", None),
    "output_layer.weight": ("head.weight", 0),  # tied: bench's head.weight is tok_emb.weight
}
_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def bench_tensor_for(name: str, chunk: GPTModel, bench, n_heads: int, tp_rank: int, tp: int) -> torch.Tensor:
    """The slice of bench's model that Megatron parameter ``name`` of ``chunk`` holds on tp_rank
    (query groups and the gated MLP are read off bench's projection widths / modules)."""
    m = _LAYER_RE.match(name)
    if m:
        j, rest = int(m.group(1)), m.group(2)
        if rest not in _LAYER_MAP:
            raise KeyError(f"no bench weight for Megatron parameter {name}")
        block = bench.blocks[str(chunk.decoder.layers[j].layer_number - 1)]  # layer_number: global, 1-based
        src, split = _LAYER_MAP[rest]
        part, what = src.split(".", 1) if src.startswith(("qkv.", "fc1.", "fc2.")) else (None, src)
        if part == "fc1":
            return _fc1(block.mlp, what, tp_rank, tp)
        t = (_qkv(block.attn, what, n_heads) if part == "qkv" else _fc2(block.mlp, what) if part == "fc2"
             else block.get_parameter(src))
    elif name in _TOP_MAP:
        src, split = _TOP_MAP[name]
        t = bench.get_parameter(src)
    else:
        raise KeyError(f"no bench weight for Megatron parameter {name}")
    return t if split is None else t.chunk(tp, dim=split)[tp_rank]


@torch.no_grad()
def load_bench_weights(chunk: GPTModel, bench, n_heads: int, tp_rank: int, tp: int) -> int:
    """Copy bench's weights into every parameter of an unwrapped chunk; returns the count.
    (A tied output layer on a pipeline stage without the embedding gets bench's token embedding.)"""
    n = 0
    for name, p in chunk.named_parameters():
        src = bench_tensor_for(name, chunk, bench, n_heads, tp_rank, tp)
        if src.shape != p.shape:
            raise ValueError(f"{name}: Megatron shape {tuple(p.shape)} != bench slice {tuple(src.shape)}")
        p.copy_(src.to(device=p.device, dtype=p.dtype))
        n += 1
    return n

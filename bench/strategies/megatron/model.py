"""Megatron-core's GPTModel with bench's model dims (imports megatron.core: import lazily).

* TransformerConfig: bench's d_model / n_heads / n_layers / d_ff, LayerNorm (eps 1e-5),
  tanh-approximate GELU, biases on every linear, no dropout, N(0, 0.02) init with
  1/sqrt(2L)-scaled output projections, no fusions that need apex / TE / CUDA extensions.
* GPTModel: learned absolute position embeddings, untied output layer, vocab split over TP.
* Layer spec without Transformer Engine (``spec=sdpa``): Megatron's local spec with its core
  attention replaced by :class:`SDPACoreAttention` (torch scaled_dot_product_attention; the
  stock DotProductAttention materialises the [b, h, s, s] scores, ~2.5x slower end to end),
  and a torch LayerNorm that also works under sequence parallelism (:class:`LayerNorm`);
  ``spec=local`` keeps Megatron's DotProductAttention; ``spec=te`` is Megatron's TE spec.
* :func:`load_bench_weights` copies bench's GPT initialisation (bench.model.build_model)
  into a (TP-sharded, PP-split) Megatron chunk, so every layout starts from the weights of
  strategy=single.

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

from bench.strategies.base import DTYPES


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
        gqa = q.shape[1] != k.shape[1]
        if p > 0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                                                     scale=self.softmax_scale, enable_gqa=gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                                                 scale=self.softmax_scale, enable_gqa=gqa)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


class LayerNorm(torch.nn.LayerNorm):
    """torch LayerNorm with Megatron's constructor; under sequence parallelism its parameters
    carry ``sequence_parallel=True`` so finalize_model_grads all-reduces their gradients over
    TP (Megatron's stock torch-norm wrapper refuses sequence parallelism)."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_unused):
        device = None if config.use_cpu_initialization or not torch.cuda.is_available() \
            else torch.cuda.current_device()
        super().__init__(hidden_size, eps=eps, device=device, dtype=config.params_dtype)
        for p in self.parameters():
            setattr(p, "sequence_parallel", config.sequence_parallel)


def transformer_config(model_cfg: dict, *, tp: int = 1, pp: int = 1, virtual_pipeline: int = 1,
                       sequence_parallel: bool = False, precision: str = "bf16",
                       use_cpu_initialization: bool = False, perform_initialization: bool = True,
                       batch_p2p_sync: bool = True, timeout_s: int = 600) -> TransformerConfig:
    dtype = DTYPES[precision]
    return TransformerConfig(
        num_layers=model_cfg["n_layers"], hidden_size=model_cfg["d_model"],
        num_attention_heads=model_cfg["n_heads"], ffn_hidden_size=model_cfg["d_ff"],
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=virtual_pipeline if virtual_pipeline > 1 else None,
        sequence_parallel=sequence_parallel,
        # bench's GPT: pre-LN, LayerNorm eps 1e-5, tanh GELU, biases, no dropout, GPT-2 init
        normalization="LayerNorm", layernorm_epsilon=1e-5, add_bias_linear=True,
        activation_func=functools.partial(F.gelu, approximate="tanh"),
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


def layer_spec(kind: str) -> ModuleSpec:
    """The transformer-layer ModuleSpec: ``sdpa`` | ``local`` | ``te``."""
    if kind == "te":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec()
    if kind not in ("sdpa", "local"):
        raise ValueError(f"unknown layer spec {kind!r}")
    spec = get_gpt_layer_local_spec()
    sub = spec.submodules
    attn = sub.self_attention
    if kind == "sdpa":
        attn = dataclasses.replace(attn, submodules=dataclasses.replace(attn.submodules,
                                                                        core_attention=SDPACoreAttention))
    return dataclasses.replace(spec, submodules=dataclasses.replace(
        sub, input_layernorm=LayerNorm, pre_mlp_layernorm=LayerNorm, self_attention=attn))


def block_spec(config: TransformerConfig, kind: str, vp_stage: Optional[int], pp_rank: int):
    """The decoder-block spec of one model chunk: its layers and the final LayerNorm."""
    if kind == "te":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

        return get_gpt_decoder_block_spec(config, use_transformer_engine=True, vp_stage=vp_stage, pp_rank=pp_rank)
    n = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    return TransformerBlockSubmodules(layer_specs=[layer_spec(kind)] * n, layer_norm=LayerNorm)


def build_chunks(config: TransformerConfig, model_cfg: dict, kind: str) -> list[GPTModel]:
    """This rank's model chunks (one per virtual pipeline stage), parallel_state initialised."""
    v = config.virtual_pipeline_model_parallel_size or 1
    pp_rank = ps.get_pipeline_model_parallel_rank()
    chunks = []
    for i in range(v):
        vp = i if v > 1 else None
        chunks.append(GPTModel(
            config=config, transformer_layer_spec=block_spec(config, kind, vp, pp_rank),
            vocab_size=model_cfg["vocab_size"], max_sequence_length=model_cfg["seq_len"],
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            parallel_output=True, share_embeddings_and_output_weights=False,
            position_embedding_type="learned_absolute", vp_stage=vp))
    return chunks


# --------------------------------------------------------------------------- bench weights
def _qkv(attn, what: str, n_heads: int) -> torch.Tensor:
    """bench's separate q/k/v weights (or biases) in Megatron's fused layout: per head
    [q_h; k_h; v_h] (num_query_groups == n_heads), heads in order."""
    q, k, v = (getattr(getattr(attn, f"{x}_proj"), what) for x in "qkv")
    hd = q.shape[0] // n_heads
    stacked = torch.stack([t.reshape(n_heads, hd, *t.shape[1:]) for t in (q, k, v)], dim=1)
    return stacked.reshape(3 * q.shape[0], *q.shape[1:])


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
    "mlp.linear_fc1.weight": ("mlp.fc_in.weight", 0),
    "mlp.linear_fc1.bias": ("mlp.fc_in.bias", 0),
    "mlp.linear_fc2.weight": ("mlp.fc_out.weight", 1),
    "mlp.linear_fc2.bias": ("mlp.fc_out.bias", None),
}
_TOP_MAP = {
    "embedding.word_embeddings.weight": ("tok_emb.weight", 0),  # vocab split over TP
    "embedding.position_embeddings.weight": ("pos_emb.weight", None),
    "decoder.final_layernorm.weight": ("norm.weight", None),
    "decoder.final_layernorm.bias": ("norm.bias", None),
    "output_layer.weight": ("head.weight", 0),
}
_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


def bench_tensor_for(name: str, chunk: GPTModel, bench, n_heads: int, tp_rank: int, tp: int) -> torch.Tensor:
    """The slice of bench's GPT that Megatron parameter ``name`` of ``chunk`` holds on tp_rank."""
    m = _LAYER_RE.match(name)
    if m:
        j, rest = int(m.group(1)), m.group(2)
        if rest not in _LAYER_MAP:
            raise KeyError(f"no bench weight for Megatron parameter {name}")
        block = bench.blocks[str(chunk.decoder.layers[j].layer_number - 1)]  # layer_number: global, 1-based
        src, split = _LAYER_MAP[rest]
        t = _qkv(block.attn, src.split(".")[1], n_heads) if src.startswith("qkv.") else block.get_parameter(src)
    elif name in _TOP_MAP:
        src, split = _TOP_MAP[name]
        t = bench.get_parameter(src)
    else:
        raise KeyError(f"no bench weight for Megatron parameter {name}")
    return t if split is None else t.chunk(tp, dim=split)[tp_rank]


@torch.no_grad()
def load_bench_weights(chunk: GPTModel, bench, n_heads: int, tp_rank: int, tp: int) -> int:
    """Copy bench's weights into every parameter of an unwrapped chunk; returns the count."""
    n = 0
    for name, p in chunk.named_parameters():
        src = bench_tensor_for(name, chunk, bench, n_heads, tp_rank, tp)
        if src.shape != p.shape:
            raise ValueError(f"{name}: Megatron shape {tuple(p.shape)} != bench slice {tuple(src.shape)}")
        p.copy_(src.to(device=p.device, dtype=p.dtype))
        n += 1
    return n

"""The decoder every strategy trains: ``model.arch=gpt`` (the default) or ``llama``.

gpt: token + learned position embeddings, pre-LN blocks (causal self-attention through
``scaled_dot_product_attention``, tanh-GELU MLP), a final LayerNorm and an output projection;
biases on every linear.

llama (Llama 2/3 layout): token embeddings only, pre-RMSNorm blocks, rotary position embeddings
on q and k, grouped-query attention (``n_kv_heads`` key/value heads), a SwiGLU MLP
(``down(silu(gate(x)) * up(x))``; ``mlp_act=gelu_tanh``: GeGLU, as Gemma), a final RMSNorm, no biases
(``qkv_bias``: on q/k/v, as Qwen2), optionally tied embeddings.
RoPE is plain RoPE with base ``rope_theta`` (Llama 3's long-context "llama3" rope scaling of the
frequencies is not applied: it changes neither FLOPs nor memory).

Layout choices made for the parallel strategies:

* q/k/v/o and the MLP are separate ``nn.Linear`` s, so tensor parallelism can shard them
  column-wise (q/k/v_proj, fc_in | gate_proj, up_proj) and row-wise (o_proj, fc_out | down_proj);
  attention infers its local query and key/value head counts from the projection widths.
* ``blocks`` is a ModuleDict and every top-level part may be ``None``, so a pipeline
  stage is this same class with the parts it does not own deleted.  The rotary tables are
  computed in ``GPT.forward`` (once per forward, from the stage's first block) and handed to each
  block; a block or attention called without them computes them itself.  They are not buffers
  (DDP would broadcast buffers every step).
* The loss can be computed inside the model (``GPT.forward(x, targets=y)``), by the head: with
  ``Head.loss_chunks`` = k > 1 (``loss_chunks=k``) in k chunks of tokens, each checkpointed, so that only one
  chunk's logits and loss buffers are alive at a time.  The head's weight is then used inside the forward of
  the module that owns it, which is where FSDP2 and DeepSpeed ZeRO-3 gather it.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F

from bench.spec.schema import ModelConfig

# precision name -> the dtype of a run's 16-bit compute (or fp32): one table for every strategy; fp8: bf16, the
# dtype of everything but the float8 matmuls (bench/parallel/float8.py)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}

ARCHS = ("gpt", "llama")


# --------------------------------------------------------------------------- rotary embeddings
def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [seq_len, head_dim] (fp32) of non-interleaved ("rotate half") RoPE:
    position p, frequency i < head_dim/2: angle p / theta^(2i/head_dim), repeated for both halves.
    Computed as megatron-core's RotaryEmbedding does (inv_freq, outer product, cat(freqs, freqs))."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    pos = torch.arange(seq_len, dtype=torch.float32, device=device)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on t [..., seq, head_dim] (cos/sin [seq, head_dim]), in t's dtype (as Megatron)."""
    return t * cos.to(t.dtype) + rotate_half(t) * sin.to(t.dtype)


def sdpa_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(k, v, enable_gqa) for scaled_dot_product_attention on [b, heads, s, head_dim] with fewer
    key/value than query heads (query head i reads key/value head i // (q heads / kv heads)).
    Half precision: SDPA's own GQA (the flash kernel reads the shared heads, nothing is copied).
    fp32: k and v repeated per query head (no flash kernel in fp32; GQA would fall back to the math
    kernel, which materialises the [s, s] scores).  Used by bench's model and by Megatron's
    SDPACoreAttention alike."""
    rep = q.shape[-3] // k.shape[-3]
    if rep == 1:
        return k, v, False
    if q.dtype in (torch.float16, torch.bfloat16):
        return k, v, True
    return k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3), False


# --------------------------------------------------------------------------- modules
class Attention(nn.Module):
    """Causal self-attention. ``n_kv_heads`` < n_heads: grouped-query attention; ``rope_theta``
    set: rotary position embeddings on q and k.  ``recompute_core`` (recompute=selective,
    bench/parallel/ac.py): the attention core is recomputed in backward instead of kept."""

    recompute_core = False

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: Optional[int] = None, bias: bool = True,
                 rope_theta: Optional[float] = None, qkv_bias: bool = False):
        super().__init__()
        self.head_dim = d_model // n_heads
        kv_width = (n_kv_heads or n_heads) * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias or qkv_bias)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias or qkv_bias)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias or qkv_bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rope_theta = rope_theta

    def rope(self, seq_len: int, device) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """This attention's (cos, sin) tables, or None without rotary embeddings."""
        if self.rope_theta is None:
            return None
        return rope_cos_sin(seq_len, self.head_dim, self.rope_theta, device)

    def forward(self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_heads / tp query heads and
        # n_kv_heads / tp key/value heads
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.rope_theta is not None:
            cos, sin = rope if rope is not None else self.rope(s, q.device)
            cos, sin = cos[:s], sin[:s]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.recompute_core and torch.is_grad_enabled():
            y = torch.utils.checkpoint.checkpoint(_attention_core, q, k, v, use_reentrant=False)
        else:
            y = _attention_core(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v, causal, through scaled_dot_product_attention (grouped k / v heads)."""
    k, v, gqa = sdpa_kv(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


class MLP(nn.Module):
    """gpt: fc_out(gelu_tanh(fc_in(x)))."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff)
        self.fc_out = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x), approximate="tanh"))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


GATE_ACTS = {"silu": F.silu, "gelu_tanh": gelu_tanh}  # model.mlp_act


class SwiGLU(nn.Module):
    """llama: down_proj(act(gate_proj(x)) * up_proj(x)), no biases; act silu (SwiGLU) or tanh-GELU (GeGLU)."""

    def __init__(self, d_model: int, d_ff: int, act: str = "silu"):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)
        self.act = GATE_ACTS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, arch: str = "gpt", n_kv_heads: Optional[int] = None,
                 rope_theta: float = 500000.0, norm_eps: float = 1e-5, qkv_bias: bool = False, mlp_act: str = "silu"):
        super().__init__()
        if arch == "gpt":
            self.ln_attn = nn.LayerNorm(d_model, eps=norm_eps)
            self.attn = Attention(d_model, n_heads)
            self.ln_mlp = nn.LayerNorm(d_model, eps=norm_eps)
            self.mlp = MLP(d_model, d_ff)
        else:
            self.ln_attn = nn.RMSNorm(d_model, eps=norm_eps)
            self.attn = Attention(d_model, n_heads, n_kv_heads, bias=False, rope_theta=rope_theta, qkv_bias=qkv_bias)
            self.ln_mlp = nn.RMSNorm(d_model, eps=norm_eps)
            self.mlp = SwiGLU(d_model, d_ff, mlp_act)

    def forward(self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x), rope=rope)
        return x + self.mlp(self.ln_mlp(x))


class Head(nn.Linear):
    """The output projection: ``head(x)`` the logits; ``head(x, targets)`` the mean next-token loss.  With
    ``loss_chunks`` = k > 1 (bench/parallel/ac.py apply_loss_chunks) the tokens go in k chunks, each chunk's
    matmul and fp32 cross entropy under a non-reentrant checkpoint: only one chunk's logits and loss buffers are
    alive at a time (forward and backward), at one more head matmul per token (its forward again in backward)."""

    loss_chunks = 1

    def forward(self, x: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        if targets is None:
            return super().forward(x)
        if self.loss_chunks == 1:
            return lm_loss(super().forward(x), targets)
        xs = x.reshape(-1, x.shape[-1]).tensor_split(self.loss_chunks)
        ys = targets.reshape(-1).tensor_split(self.loss_chunks)
        total = sum(torch.utils.checkpoint.checkpoint(self._loss_sum, xc, yc, use_reentrant=False)
                    for xc, yc in zip(xs, ys))
        return total / targets.numel()

    def _loss_sum(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(super().forward(x).float(), targets, reduction="sum")


class GPT(nn.Module):
    """bench's one model class (both archs)."""

    def __init__(self, d_model: int, n_heads: int, n_layers: int, d_ff: int, vocab_size: int, seq_len: int,
                 arch: str = "gpt", n_kv_heads: Optional[int] = None, tie_embeddings: bool = False,
                 rope_theta: float = 500000.0, norm_eps: float = 1e-5, qkv_bias: bool = False, mlp_act: str = "silu",
                 **_ignored):
        super().__init__()
        if arch not in ARCHS:
            raise ValueError(f"arch={arch!r}: valid: {', '.join(ARCHS)}")
        if arch == "gpt" and n_kv_heads not in (None, n_heads):
            raise ValueError("grouped-query attention (n_kv_heads != n_heads) needs arch=llama")
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model) if arch == "gpt" else None
        self.blocks = nn.ModuleDict({str(i): Block(d_model, n_heads, d_ff, arch, n_kv_heads, rope_theta, norm_eps,
                                                   qkv_bias, mlp_act) for i in range(n_layers)})
        self.norm = nn.LayerNorm(d_model, eps=norm_eps) if arch == "gpt" else nn.RMSNorm(d_model, eps=norm_eps)
        if tie_embeddings:
            self.head = Head(d_model, vocab_size, bias=False, device="meta")
            self.head.weight = self.tok_emb.weight
        else:
            self.head = Head(d_model, vocab_size, bias=False)
        self._init_weights(n_layers)

    def _init_weights(self, n_layers: int) -> None:
        """GPT-2 init: N(0, 0.02), residual output projections scaled by 1/sqrt(2L); norm
        weights 1, biases 0 (a tied head is the token embedding, initialised once)."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.zeros_(p) if name.endswith("bias") else nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "fc_out.weight", "down_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers))
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None,
                targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Token ids [b, s] -> logits [b, s, vocab] (or hidden states between pipeline stages); with ``targets``
        [b, s] the mean loss, computed by the head (``Head``).  ``positions`` [1, s]: each token's place in the
        whole sequence, where this rank holds only some of them (context parallelism: a load-balanced shard of the
        sequence); None: 0 .. s-1."""
        pos = torch.arange(x.shape[1], device=x.device) if positions is None else positions[0]
        if self.tok_emb is not None:
            if self.pos_emb is not None:
                x = self.tok_emb(x) + self.pos_emb(pos)
            else:
                x = self.tok_emb(x)
        rope = None
        if len(self.blocks):  # rotary tables once per forward (None for gpt), at this rank's positions
            attn = next(iter(self.blocks.values())).attn
            if positions is None:
                rope = attn.rope(x.shape[1], x.device)
            elif attn.rope_theta is not None:
                cos, sin = attn.rope(self.seq_len, x.device)
                rope = cos[pos], sin[pos]
        for block in self.blocks.values():
            x = block(x, rope=rope)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x) if targets is None else self.head(x, targets)
        return x


def build_model(model: ModelConfig, seed: int, device: str | torch.device) -> GPT:
    """The same initial weights for every strategy on a given device type (``meta``: shapes only)."""
    torch.manual_seed(seed)
    with torch.device(device):
        return GPT(model.d_model, model.n_heads, model.n_layers, model.d_ff, model.vocab_size, model.seq_len,
                   arch=model.arch, n_kv_heads=model.n_kv_heads, tie_embeddings=model.tie_embeddings,
                   rope_theta=model.rope_theta, norm_eps=model.norm_eps, qkv_bias=model.qkv_bias,
                   mlp_act=model.mlp_act)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy, computed in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def model_loss(model: nn.Module, x: torch.Tensor, targets: torch.Tensor, positions: Optional[torch.Tensor] = None,
               loss_chunks: int = 1) -> torch.Tensor:
    """A strategy's micro-batch loss: ``loss_chunks`` > 1, the model's own chunked loss (``Head``); 1, the logits
    then ``lm_loss`` outside the model, as before the knob (a compiled whole model's graph stays the logits')."""
    if loss_chunks > 1:
        return model(x, positions=positions, targets=targets)
    return lm_loss(model(x, positions=positions), targets)

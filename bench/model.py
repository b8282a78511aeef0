"""The GPT decoder every strategy trains.

Token + learned position embeddings, pre-LN blocks (causal self-attention through
``scaled_dot_product_attention``, GELU MLP), a final LayerNorm and an untied output
projection.  Layout choices made for the parallel strategies:

* q/k/v/o and the MLP are separate ``nn.Linear`` s, so tensor parallelism can shard them
  column-/row-wise; attention infers its local head count from the projection width.
* ``blocks`` is a ModuleDict and every top-level part may be ``None``, so a pipeline
  stage is this same class with the parts it does not own deleted.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_heads / tp of them
        q, k, v = (p(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff)
        self.fc_out = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(F.gelu(self.fc_in(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int):
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)
        self.ln_mlp = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_layers: int, d_ff: int,
                 vocab_size: int, seq_len: int, **_ignored):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleDict({str(i): Block(d_model, n_heads, d_ff) for i in range(n_layers)})
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self._init_weights(n_layers)

    def _init_weights(self, n_layers: int) -> None:
        """GPT-2 init: N(0, 0.02), residual output projections scaled by 1/sqrt(2L)."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.zeros_(p) if name.endswith("bias") else nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "fc_out.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers))
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids [b, s] -> logits [b, s, vocab] (or hidden states between pipeline stages)."""
        if self.tok_emb is not None:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(pos)
        for block in self.blocks.values():
            x = block(x)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)
        return x


def build_model(model_cfg: dict, seed: int, device: str | torch.device) -> GPT:
    """The same initial weights for every strategy on a given device type."""
    torch.manual_seed(seed)
    with torch.device(device):
        return GPT(**model_cfg)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy, computed in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

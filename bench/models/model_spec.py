"""What a model's architecture decides, counted in one place: parameters by part, FLOPs per token, the Linear
layers precision=fp8 converts, the activations a layer saves per token, the parameter tensors of a block.

Why: GPT and Llama differ in norms, MLP, biases and positions, and the memory plan, the traffic terms and the
FLOPs all depend on it; each count that differs is a method of the family's class here (torchtitan's
``get_nparams_and_flops`` is the model), so generic code asks ``describe_model(model_cfg)`` and never branches on
``model.arch``.  bench/models/model.py builds the modules these count; the tests check the counts against the built
model and torch's FlopCounterMode.

flops/token = 6N + 12 * L * d * seq  (forward + backward; PaLM appendix B)
  N   = parameters that take part in matrix multiplies: the L blocks (attention, MLP, their biases and norms),
        the final norm and the output projection d x V (counted when tied too: it is a matmul); token and
        position embeddings (lookups) are excluded.
  12*L*d*seq = attention scores and weighted sum (QK^T, AV), forward + backward, without the causal-mask
        saving, as is conventional (d = n_heads * head_dim = d_model; the same with grouped-query attention).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from bench.spec.schema import ConfigError, ModelConfig


class SavedPerToken(NamedTuple):
    """Elements one layer saves for backward per token, unsplit (the memory plan sets dtypes and tp splits)."""

    norm_inputs: int  # the two norms' inputs
    projection_inputs: int  # one copy per projection reading a norm's output (eager autocast casts each)
    shared_inputs: int  # one per norm output (compiled: one cast shared by the projections that read it)
    attention: int  # q, k, v and the attention output (the fused kernel's and o_proj's input)
    mlp: int  # the MLP's intermediates in the activation dtype, the down projection's input aside
    mlp_down_input: int  # the MLP's last projection's input (a converted Linear's under fp8)


class Matmul(NamedTuple):
    """One Linear of a block, in the order its forward runs them."""

    inputs: int
    outputs: int
    row_parallel: bool = False  # tensor parallelism splits its input: each rank's output is the whole width


class OpSaved(NamedTuple):
    """Elements one block saves per token under recompute=op (bench/parallel/ac.py ``op_policy``: the odd matmuls'
    outputs and attention's), beside its input."""

    split: int  # column-parallel matmul outputs and the attention output: split over tp
    whole: int  # row-parallel matmul outputs (each rank's partial sums, the whole width)
    lse: int  # the attention kernel's log-sum-exp, fp32, one per head


@dataclass(frozen=True)
class ModelDescription:
    """Sizes every family shares; a family's class says what its blocks hold."""

    d: int
    heads: int
    kv_heads: int
    ff: int
    vocab: int
    seq: int
    layers: int
    tied: bool

    grouped_query = False  # n_kv_heads may be fewer than n_heads
    rotary = False  # rotary position embeddings (an even head dimension)
    position_embedding = False  # a learned position table, counted with the token embedding
    norm_tensors = 1  # a norm's parameter tensors of d elements (weight; and bias)
    mlp_inputs = 1  # the MLP's projections reading its norm's output

    @classmethod
    def options(cls, model: ModelConfig) -> dict:
        """The family's own fields from the model config."""
        return {}

    @property
    def head_dim(self) -> int:
        return self.d // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    # -- what a family defines
    def block_params(self) -> int:
        raise NotImplementedError

    def linear_tensors(self) -> int:
        """A block's Linear weights and biases."""
        raise NotImplementedError

    def block_matmuls(self) -> tuple[Matmul, ...]:
        """The block's Linear layers in forward order (q, k, v, o, then the MLP's)."""
        d, kv = self.d, self.kv_dim
        return (Matmul(d, d), Matmul(d, kv), Matmul(d, kv), Matmul(d, d, True), *self.mlp_matmuls())

    def mlp_matmuls(self) -> tuple[Matmul, ...]:
        raise NotImplementedError

    def mlp_saved_intermediates(self, compiled: bool) -> int:
        """d_ff-wide tensors the MLP saves beside its last projection's input (plain MLP: fc_in's output, which
        GELU's backward reads; GELU's output is fc_out's input)."""
        return 1

    # -- parameters
    def norm_params(self) -> int:
        """One norm's parameters."""
        return self.norm_tensors * self.d

    def norm_params_per_block(self) -> int:
        """The two norms' parameters of a block: replicated over tensor parallelism."""
        return 2 * self.norm_params()

    def block_linear_params(self) -> int:
        """A block's nn.Linear parameters, weights and biases: the block but its norms."""
        return self.block_params() - self.norm_params_per_block()

    def param_groups(self) -> dict[str, int]:
        """Parameters by part: embedding (token + learned positions), one block, the final norm, the output
        projection (d x V, also when tied), and whether it is tied."""
        emb = self.vocab * self.d + (self.seq * self.d if self.position_embedding else 0)
        return {"embedding": emb, "block": self.block_params(), "norm": self.norm_params(),
                "head": self.d * self.vocab, "tied": self.tied}

    def matmul_params(self) -> int:
        g = self.param_groups()
        return self.layers * g["block"] + g["norm"] + g["head"]

    def total_params(self) -> int:
        """Unique parameters of bench.models.model.build_model: a tied output projection once."""
        g = self.param_groups()
        return g["embedding"] + self.layers * g["block"] + g["norm"] + (0 if g["tied"] else g["head"])

    # -- FLOPs
    def flops_per_token(self) -> int:
        return 6 * self.matmul_params() + 12 * self.layers * self.d * self.seq

    def hardware_flops_per_token(self, recompute: str, share: float = 1.0) -> int:
        """FLOPs the device executes per token, the recomputed forward included (HFU's numerator); ``share``: the
        checkpointed share of the blocks under full recompute (recompute_every); op: the matmuls it recomputes."""
        attn_fwd = 4 * self.layers * self.d * self.seq
        extra = {"none": 0, "selective": attn_fwd, "full": share * (2 * self.layers * self.block_params() + attn_fwd),
                 "op": 2 * self.layers * sum(mm.inputs * mm.outputs for mm in self.op_recomputed_matmuls())}
        return round(self.flops_per_token() + extra[recompute])

    def checkpoint_skipped_flops_per_token(self, share: float = 1.0) -> int:
        """Of full recompute's counted forward (hardware_flops_per_token), what torch's checkpoint does not run
        again: each checkpointed block's last matmul, whose output only joins the residual stream (its
        non-reentrant checkpoint stops once backward has every tensor it needs; a compiled backward has no use for
        it either).  ``share``: the checkpointed share of the blocks."""
        last = self.block_matmuls()[-1]
        return round(share * 2 * self.layers * last.inputs * last.outputs)

    def head_forward_flops(self) -> int:
        """The output projection's forward per token (2 d vocab): what loss_chunks > 1 runs again in backward."""
        return 2 * self.d * self.vocab

    # -- recompute=op (bench/parallel/ac.py op_policy: the 1st, 3rd, ... matmul of a block saved)
    def op_recomputed_matmuls(self) -> tuple[Matmul, ...]:
        """The even matmuls, run again in backward; not the block's last, whose output only joins the residual stream:
        backward never asks for it (torch's checkpoint stops before it, a compiled backward has no use for it)."""
        mms = self.block_matmuls()
        return tuple(mm for i, mm in enumerate(mms) if i % 2 == 1 and i < len(mms) - 1)

    def op_recomputed_share(self) -> float:
        """The share of a block's forward matmul FLOPs that recompute=op runs again."""
        return (sum(mm.inputs * mm.outputs for mm in self.op_recomputed_matmuls())
                / sum(mm.inputs * mm.outputs for mm in self.block_matmuls()))

    def op_saved_per_token(self, compiled: bool) -> OpSaved:
        """What one block keeps under recompute=op beside its input.  The block's last matmul, when saved, is kept by
        the eager checkpoint's storage until the block's backward though nothing reads it; a compiled graph saves
        only what its backward reads."""
        mms = self.block_matmuls()
        kept = [mm for i, mm in enumerate(mms) if i % 2 == 0 and not (compiled and i == len(mms) - 1)]
        return OpSaved(split=sum(mm.outputs for mm in kept if not mm.row_parallel) + self.d,
                       whole=sum(mm.outputs for mm in kept if mm.row_parallel), lse=self.heads)

    def causal_skipped_flops_per_token(self, recompute: str, share: float = 1.0) -> int:
        """The attention FLOPs a causal kernel never runs: flash and memory-efficient attention skip the score blocks
        above the diagonal, half of QK^T and AV in every pass (forward, backward, a recomputed forward).  The model
        and hardware FLOPs above keep the full s x s by convention; the time a step takes does not.  The other
        half is what the kernel runs (``causal_attention_flops_per_token``): the two are equal."""
        return sum(self.causal_attention_flops_per_token(recompute, share))

    def causal_attention_flops_per_token(self, recompute: str, share: float = 1.0) -> tuple[int, int]:
        """The attention FLOPs a causal kernel runs (QK^T and AV below the diagonal), (forward passes, backward):
        timed at the fused attention kernels' own rates, not the matmuls' (bench/machine/hardware.py DEFAULT_ATTENTION)."""
        passes = {"none": 0.0, "selective": 1.0, "full": share, "op": 0.0}[recompute]  # op: attention is saved
        unit = 0.5 * self.layers * self.d * self.seq
        return round(4 * (1 + passes) * unit), round(8 * unit)

    # -- precision=fp8
    def float8_matmul_params(self) -> int:
        """The blocks' Linear weights (q/k/v/o, the MLP): what precision=fp8 converts (bench/parallel/float8.py;
        the head stays bf16; layers left in bf16 for their shapes are not subtracted)."""
        d = self.d
        return self.layers * (2 * d * d + 2 * d * self.kv_dim + (self.mlp_inputs + 1) * d * self.ff)

    def float8_cast_elements_per_layer_token(self) -> int:
        """Elements cast to float8 per token in one block's converted Linear layers: each input (forward) and
        output gradient (backward), as torchao casts them before each float8 matmul."""
        d, ff, up = self.d, self.ff, self.mlp_inputs
        inputs = 4 * d + up * d + ff  # q, k, v, o; the MLP's input projection(s); its last projection
        output_grads = 2 * d + 2 * self.kv_dim + up * ff + d
        return inputs + output_grads

    # -- memory and traffic
    def saved_per_token(self, compiled: bool) -> SavedPerToken:
        """What one layer saves for backward, per token (bench/plan/memory_model.py's layer terms)."""
        d = self.d
        return SavedPerToken(norm_inputs=2 * d, projection_inputs=(3 + self.mlp_inputs) * d, shared_inputs=2 * d,
                             attention=2 * self.heads * self.head_dim + 2 * self.kv_dim,
                             mlp=self.mlp_saved_intermediates(compiled) * self.ff, mlp_down_input=self.ff)

    def block_param_tensors(self) -> int:
        return self.linear_tensors() + 2 * self.norm_tensors

    def end_param_tensors(self) -> int:
        """Parameter tensors outside the blocks: embeddings, the final norm, an untied head."""
        return (2 if self.position_embedding else 1) + self.norm_tensors + (0 if self.tied else 1)


@dataclass(frozen=True)
class GPTDescription(ModelDescription):
    """LayerNorms (weight and bias), learned positions, a tanh-GELU MLP, biases on every Linear."""

    position_embedding = True
    norm_tensors = 2

    def block_params(self) -> int:
        d, ff = self.d, self.ff
        return (4 * d * d + 4 * d) + (2 * d * ff + ff + d) + self.norm_params_per_block()  # attention, MLP, norms

    def linear_tensors(self) -> int:
        return 12  # q/k/v/o, fc_in, fc_out: weight and bias each

    def mlp_matmuls(self) -> tuple[Matmul, ...]:
        return Matmul(self.d, self.ff), Matmul(self.ff, self.d, True)  # fc_in, fc_out


@dataclass(frozen=True)
class LlamaDescription(ModelDescription):
    """RMSNorms, rotary positions, grouped-query attention, a gated MLP (SwiGLU, or GeGLU with
    mlp_act=gelu_tanh: the same counts), no biases but Qwen2's q/k/v ones (qkv_bias)."""

    qkv_bias: bool = False
    mlp_act: str = "silu"

    grouped_query = True
    rotary = True
    mlp_inputs = 2  # gate and up

    @classmethod
    def options(cls, model: ModelConfig) -> dict:
        return {"qkv_bias": bool(model.qkv_bias), "mlp_act": model.mlp_act}

    def block_params(self) -> int:
        d, kv = self.d, self.kv_dim
        block = 2 * d * d + 2 * d * kv + 3 * d * self.ff + self.norm_params_per_block()  # q, o; k, v; gate, up, down
        return block + ((d + 2 * kv) if self.qkv_bias else 0)

    def linear_tensors(self) -> int:
        return 7 + (3 if self.qkv_bias else 0)  # q/k/v/o, gate, up, down; q/k/v biases

    def mlp_matmuls(self) -> tuple[Matmul, ...]:
        d, ff = self.d, self.ff
        return Matmul(d, ff), Matmul(d, ff), Matmul(ff, d, True)  # gate, up, down

    def mlp_saved_intermediates(self, compiled: bool) -> int:
        """gate, up and act(gate) (down's input is their product); compiled, act(gate) is recomputed in backward."""
        return 2 if compiled else 3


FAMILIES: dict[str, type[ModelDescription]] = {"gpt": GPTDescription, "llama": LlamaDescription}


def describe_model(model: ModelConfig) -> ModelDescription:
    """The description of a model config (``model.*``: a preset, a Hugging Face config, overrides)."""
    arch = model.arch
    if arch not in FAMILIES:
        raise ConfigError("model.arch", arch, f"valid: {', '.join(FAMILIES)}")
    family = FAMILIES[arch]
    return family(d=model.d_model, heads=model.n_heads, kv_heads=model.n_kv_heads or model.n_heads,
                 ff=model.d_ff, vocab=model.vocab_size, seq=model.seq_len, layers=model.n_layers,
                  tied=bool(model.tie_embeddings), **family.options(model))

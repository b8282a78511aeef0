"""Saved activations and the loss' logits per rank (the memory plan's activation terms, bench/plan/memory_model.py's
docstring says what each counts and from where), and the parameters a rank holds by its layout."""
from __future__ import annotations

from typing import Any, Optional

from bench.models.model_spec import describe_model
from bench.parallel.float8 import saves_float8_inputs
from bench.costs.forward_end import forward_end_bytes
from bench.costs.traffic import RING_GRAD_BYTES, compute_bytes, kv_bytes, local_tokens
from bench.spec.schema import Plan


# ------------------------------------------------------------------------------ parameters
def params_per_rank(plan: Plan, tp_splits_vocab: bool, stage: Optional[str] = None) -> dict[str, float]:
    """Parameters on a pipeline stage of this layout ("first" or "last"; None: the larger one), per
    tensor-parallel rank."""
    m, tp, pp = plan.model, plan.tp, plan.pp
    desc = describe_model(m)
    g = desc.param_groups()
    norms_per_block = desc.norm_params_per_block()  # replicated over tp
    block = (g["block"] - norms_per_block) / tp + norms_per_block
    blocks = block * m.n_layers / pp
    vocab_div = tp if tp_splits_vocab else 1
    emb = g["embedding"] / vocab_div
    # a tied head is the embedding itself, except on a pipeline's last stage, which holds a copy
    head = (0 if g["tied"] and pp == 1 else g["head"]) / vocab_div
    first = emb + blocks + (g["norm"] + head if pp == 1 else 0)
    last = blocks + g["norm"] + head
    stage = stage or ("first" if first >= last or pp == 1 else "last")
    own = first if stage == "first" else last
    # the head's matmul weight (d x V / tp), a copy of the tied embedding too, on the stage that computes the loss
    head_matmul = g["head"] / vocab_div if pp == 1 or stage == "last" else 0.0
    return {"params": own, "stage": stage, "blocks": blocks, "embedding_and_head": own - blocks, "head": head_matmul}


# ------------------------------------------------------------------------------ activations
def _act_dtypes(plan: Plan, lay) -> tuple[int, int, int]:
    """(bytes of a saved activation, bytes of a norm input, projection-input copies per consumer (1: one
    16-bit cast per projection under eager autocast, 0: one shared tensor)) for how this run computes."""
    if plan.run.precision == "fp32":
        return 4, 4, 0
    if lay.sixteen_bit_weights:
        return 2, 2, 0
    # compiled, Inductor casts a norm's output once for all the projections that read it
    return 2, 4, 0 if plan.run.compile or lay.shared_input_casts else 1


def float8_input_bytes(plan: Plan, act: int, per_consumer: int) -> int:
    """Bytes per element of the input a converted Linear saves for backward: 1 where it saves a float8 cast
    (precision=fp8, compiled, tensorwise / rowwise: bench/parallel/float8.py saves_float8_inputs), else the
    activation's (bf16 runs; rowwise_with_gw_hp; eager per-projection casts, where torchao saves its bf16 input)."""
    return 1 if saves_float8_inputs(plan.run) and not per_consumer else act


def layer_activation_bytes(plan: Plan, b: int, lay) -> dict[str, float]:
    """Saved activations of one transformer layer for a micro-batch of b sequences (module docstring);
    ``float8_saved``: what precision=fp8's float8-saved Linear inputs take off them (0 otherwise)."""
    m, tp = plan.model, plan.tp
    d = m.d_model
    desc = describe_model(m)
    e = desc.saved_per_token(bool(plan.run.compile))  # elements, by kind (bench/models/model_spec.py)
    act, norm_in, per_consumer = _act_dtypes(plan, lay)
    lin = float8_input_bytes(plan, act, per_consumer)  # a converted Linear's saved input: q/k/v, gate/up, down
    tokens = b * m.seq_len // plan.cp  # the rank's shard of each sequence under context parallelism
    # replicated over tp (split too with sequence parallelism): the two norms' inputs and the projections' inputs
    sp = tp if lay.sequence_parallel else 1
    norms = e.norm_inputs * norm_in / sp
    inputs = (e.projection_inputs * act if per_consumer else e.shared_inputs * lin) / sp
    # split over tp: q, k, v and the attention output (one tensor: bf16 under fp8 too, the kernel's backward reads
    # it); the MLP's intermediates and its last projection's input
    attn = e.attention * act / tp
    mlp = (e.mlp * act + e.mlp_down_input * lin) / tp
    per_token = norms + inputs + attn + mlp + lay.extra_saved_per_token * act / tp
    saved = (0 if per_consumer else e.shared_inputs / sp + e.mlp_down_input / tp) * (act - lin)
    # offload_activations packs every saved reference apart: a shared input once per projection that saves it, and
    # the attention output again as the output projection's input (a view of it; H200 pinned peaks, torch 2.11)
    aliases = ((0 if per_consumer else (e.projection_inputs - e.shared_inputs) * lin / sp)
               + desc.heads * desc.head_dim * act / tp)
    return {"per_token": per_token, "tokens": tokens, "bytes": tokens * per_token, "block_input": tokens * d * norm_in,
            "float8_saved": tokens * saved, "op_saved": tokens * op_saved_per_token(plan, act),
            "packed_aliases": tokens * aliases}


def op_saved_per_token(plan: Plan, act: int) -> float:
    """Bytes a block keeps per token under recompute=op beside its input (bench/models/model_spec.py
    ``op_saved_per_token``): matmul and attention outputs in the activation dtype, the column-parallel ones and
    attention's split over tp, the row-parallel ones' partial sums whole; the log-sum-exp in fp32."""
    e = describe_model(plan.model).op_saved_per_token(bool(plan.run.compile))
    return (e.split * act + e.lse * 4) / plan.tp + e.whole * act


def in_flight_microbatches(plan: Plan, stage: str = "first") -> int:
    """Micro-batches whose activations a pipeline stage holds at its peak: GPipe all; 1F1B min(m, pp) on the first
    stage and one on the last (it runs each backward right after its forward); interleaved 1F1B the warm-up
    chunks of 1/v of the layers plus the running one."""
    if plan.pp == 1:
        return 1
    m, pp = plan.grad_accum, plan.pp
    sched, v = plan.layout.schedule, plan.layout.virtual_pipeline
    if sched == "gpipe":
        return m
    warmup = 2 * (pp - 1) if stage == "first" else 0  # rank r warms up 2 (pp - r - 1) + (v - 1) pp chunks
    if v > 1:
        return min(m, -(-(warmup + 1 + (v - 1) * pp) // v))
    return min(m, pp if stage == "first" else 1)


def autocast_copy_bytes(plan: Plan, lay, matmul_params: float) -> float:
    """torch.autocast's 16-bit copies of fp32 weights (every matmul weight and bias on the rank): the forward
    caches one per weight and each Linear saves it for its backward, so all are alive when backward starts."""
    if plan.run.precision == "fp32" or lay.sixteen_bit_weights:
        return 0.0
    return 2 * matmul_params


def weight_copy_bytes(plan: Plan, lay, ranks: dict) -> float:
    """The matmul weights' copies alive when backward starts: autocast's 16-bit ones.  Under precision=fp8 (always
    compiled) only the head's (it stays in bf16): for the Linear layers torchao converts (bench/parallel/float8.py)
    Inductor's partitioner casts each weight again in backward from the weight the backward holds anyway (the
    parameter, or FSDP2's gathered unit) rather than keep its float8 copy; where FSDP2 gathers in float8 the
    gathered weight is the copy.  Counting a float8 copy of every block's weights planned `single` 7-9% high and
    FSDP2 without the float8 all-gather 6-14% high (results/2026-12-02-h200x1-fp8-kernels)."""
    if plan.run.precision != "fp8":
        return autocast_copy_bytes(plan, lay, ranks["blocks"] + ranks["head"])
    return autocast_copy_bytes(plan, lay, ranks["head"])


def activation_bytes(plan: Plan, lay, ranks: Optional[dict] = None) -> dict[str, Any]:
    """Saved activations of the in-flight micro-batches, the loss' logits buffers, and what backward's start
    adds to them: autocast's weight copies, or (full recompute) one layer recomputed with its copies."""
    m, b = plan.model, plan.micro_batch_size
    ranks = ranks or params_per_rank(plan, lay.tp_splits_vocab)
    layer = layer_activation_bytes(plan, b, lay)
    layers = m.n_layers / plan.pp
    k = in_flight_microbatches(plan, ranks["stage"])
    mode = plan.layout.recompute
    copies = weight_copy_bytes(plan, lay, ranks)
    head_copy = autocast_copy_bytes(plan, lay, ranks["head"])
    if mode in ("full", "op"):  # checkpointed blocks keep their input (op: and its saved ops' outputs); their copies
        # are not saved (their forward runs again); backward rebuilds one block's others at a time (at most full's)
        ck = layers if mode == "op" else plan.layout.checkpointed(layers)  # full: all, or every recompute_every-th
        kept = layer["block_input"] + (layer["op_saved"] if mode == "op" else 0.0)
        per_mb = ck * kept + (layers - ck) * layer["bytes"]
        recomputed = layer["bytes"] + (copies - head_copy) / layers  # the blocks' copies, one layer's at a time
        at_loss = head_copy + (copies - head_copy) * (layers - ck) / layers
    else:
        ck, per_mb, recomputed, at_loss = 0.0, layers * layer["bytes"], 0.0, copies
    offloaded = 0.0
    if plan.layout.offload_activations:  # every block's saved tensors on the host, the weights its matmuls save too
        # (autocast's copies: freed on the device when autocast exits, after the loss); backward brings one
        # block's back at a time, at most
        offloaded = per_mb + (layers - ck) * (layer["packed_aliases"] + ranks["blocks"] / layers * compute_bytes(plan))
        per_mb, recomputed, at_loss = 0.0, max(recomputed, layer["bytes"]), head_copy
    saved = k * (layers - ck) * layer["float8_saved"]  # the float8-saved inputs' share (not of checkpointed blocks)
    vocab = m.vocab_size / (plan.tp if lay.tp_splits_vocab else 1)
    chunked = loss_chunk_bytes(plan, lay, layer["tokens"], vocab * lay.loss_bytes_per_logit, ranks["head"]) \
        if ranks["head"] else {}
    logits = chunked.get("chunk_logits", layer["tokens"] * vocab * lay.loss_bytes_per_logit if ranks["head"] else 0.0)
    ring = {"cp_ring": cp_ring_bytes(plan)} if plan.cp > 1 else {}
    fwd_end = forward_end_bytes(plan, copies, logits / lay.loss_bytes_per_logit) + chunked.get("input", 0.0)
    return {"layers_on_rank": layers, "microbatches_in_flight": k, "per_layer_per_microbatch": layer["bytes"],
            "recompute": mode, "activations": k * per_mb, "offloaded_per_microbatch": offloaded,
            "host_activations": k * offloaded,
            "logits": logits + chunked.get("input", 0.0) + chunked.get("head_grad", 0.0),
            "weight_copies": at_loss, "recomputed_layer": recomputed, "float8_inputs_saving": saved,
            "forward_end": fwd_end, **ring, **({"loss_chunks": chunked} if chunked else {})}


def loss_chunk_bytes(plan: Plan, lay, tokens: int, per_token: float, head: float) -> dict[str, float]:
    """loss_chunks=k > 1 (bench/models/model.py Head): the loss' buffers of one chunk of ceil(tokens / k) tokens
    (``per_token``: its logits' bytes), the others' not alive (forward and backward), beside what the checkpointed
    chunks keep for backward, their input (the final norm's output, norm-input bytes: fp32 under autocast), and,
    from the first chunk's backward on, the head weight's gradient the chunks accumulate (``head`` parameters, in
    the compute dtype: the 16-bit weight's or autocast's copy's; unchunked it comes after the logits' buffers);
    ``all_chunks``: every chunk's buffers, which the step still writes and reads (the prediction's memory-bound
    time).  {} without chunks."""
    k = plan.layout.loss_chunks
    if k == 1:
        return {}
    act, norm_in, _ = _act_dtypes(plan, lay)
    return {"chunks": k, "chunk_logits": -(-tokens // k) * per_token, "all_chunks": tokens * per_token,
            "input": tokens * plan.model.d_model * norm_in, "head_grad": head * act}


def cp_ring_bytes(plan: Plan) -> float:
    """Context parallelism's ring attention (torch's, bench/parallel/cp.py) in one layer's backward, beside the saved
    activations: the whole sequence's K and V gathered again (compute dtype) and the rank's chunk of them
    concatenated to send; the chunk's dK / dV in fp32 three times (accumulated, concatenated to send, received from
    the ring's neighbour) and dQ's fp32 accumulator.  The forward holds less (the gathered K / V and the chunk)."""
    kv, cp, fp32 = kv_bytes(plan), plan.cp, RING_GRAD_BYTES
    dq = local_tokens(plan) * plan.model.d_model / plan.tp * fp32
    return kv * (1 + 1 / cp) + 3 * kv / cp * fp32 / compute_bytes(plan) + dq

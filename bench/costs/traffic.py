"""What a strategy moves and adds per optimizer step: the terms each strategy declares
(``StrategySpec.traffic``) for the throughput prediction (bench/plan/predict.py).

A strategy's ``traffic(plan, params_on_rank)`` returns a dict; every key is optional:

bytes one rank sends per step, by how they can hide behind compute
  ``grad_reduce``   gradient all-reduce / reduce-scatter issued during backward (bucketed, overlappable)
  ``param_gather``  parameter all-gathers prefetched ahead of their use (ZeRO-3, FSDP)
  ``tail``          collectives with nothing left to overlap: a reduction after backward, a gather after
                    the optimizer step
  ``activation``    tensor-parallel all-reduces of activations (on the critical path of every layer)
  ``p2p``           pipeline sends of activations and their gradients
  ``context``       context parallelism's K / V exchange inside attention (``cp_kv_exchange``): waited on
  ``embedding_grad`` a pipeline's tied embedding: its gradient all-reduced between the first and last stage after
                    backward (over the pipeline group, costed as ``tail``)
  ``offload``       bytes over the host link (PCIe) to and from host memory
bytes the rank's HBM moves for the strategy's own memory-bound work, outside the model's layers
  ``device_bytes``  read and written at the HBM rate, as the optimizer's (FSDP2's float8 weight casts before each
                    all-gather)
counts per step
  ``collectives``   collective / point-to-point calls (each pays a latency)
  ``scalar_collectives`` collectives of a scalar or so (float8's amax all-reduces): a latency each, left out of a
                    step's typical message size (bench/plan/predict.py ``measured_link``)
  ``hooks``         framework host operations: Python hooks, per-parameter bookkeeping, DTensor dispatch
  ``syncs``         host waits on the device (``.item()``, ``synchronize``): the host cannot run ahead
  ``host_adam``     parameters whose optimizer step runs on the CPU
  ``graphed``       1: the strategy replays its step as CUDA graphs (launches cost next to nothing)
  ``eager``         1: torch.compile leaves the step eager (the strategy's module hooks break every graph)
  ``layer_host``    eager host cost of a layer's ops against plain tensors' (> 1: DTensor dispatch, which
                    torch.compile traces away); default 1
  ``grad_elem``     bytes of a gradient element as the data-parallel reduction sends it (4: fp32, 2: 16 bit, between:
                    some in each, ``reduced_in``); absent or 0 without one.  The planner says where strategies differ
                    in it (bench/planner/reduction.py)
  ``lockstep``      share of the layer passes at which the ranks' hooks meet at a collective (the slowest rank's
                    host sets the pace each time); default 1 (per-layer gathers / reductions)
  ``extra_flops``   FLOPs the rank runs beyond its 1 / world share of the step's (a replicated layer's)

Ring collectives: an all-reduce of B bytes over n ranks sends 2 B (n-1)/n per rank, an all-gather or a
reduce-scatter B (n-1)/n.  Each byte kind travels over one group (bench/plan/topology.py ``KIND_GROUP``: gradients and
parameters over the data-parallel group (its shard group under HSDP), the replicas' all-reduce of each gradient
shard (HSDP, ``grad_replicate``) over the replicate group, activations over the tensor-parallel one, sends along the
pipeline, K / V over the context-parallel one), whose placement on nodes sets the bandwidth.  Nothing here names a
strategy (bench/strategies/ hold each one's terms).
"""
from __future__ import annotations

from math import ceil
from typing import Optional

from bench.models.model_spec import describe_model
from bench.spec.schema import Plan

BYTE_KINDS = ("grad_reduce", "param_gather", "tail", "activation", "p2p", "context", "offload")
COUNT_KINDS = ("collectives", "scalar_collectives", "hooks", "syncs", "host_adam", "graphed", "eager", "layer_host",
               "lockstep", "extra_flops", "grad_elem")
FLAGS = ("graphed", "eager", "layer_host", "lockstep", "grad_elem")  # merged by the largest, not summed
# torch-native tensor parallelism: a layer's ops dispatched as DTensors cost this many times a plain layer's
# on the host (300m, TP=2, 2 x H200, eager: 243 ms a step against Megatron's 73-78 ms with the same
# all-reduces; compiled, where the dispatch is traced away: 104-114 ms; results/2026-11-23-h200x2-zero-fsdp-tp-pp)
DTENSOR_LAYER_HOST = 6.0


def all_reduce(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring all-reduce of ``nbytes`` over n ranks."""
    return 2.0 * nbytes * (n - 1) / n if n > 1 else 0.0


def all_gather(nbytes: float, n: int) -> float:
    """Bytes one rank sends in a ring all-gather (or reduce-scatter) of ``nbytes`` (the whole) over n ranks."""
    return nbytes * (n - 1) / n if n > 1 else 0.0


def hsdp_grad_reduce(nbytes: float, shard: int, replicate: int = 1) -> tuple[float, float]:
    """Bytes one rank sends reducing a gradient of ``nbytes`` (the whole) under HSDP: (reduce-scatter over the
    ``shard`` ranks of its replica, all-reduce of its 1/shard over the ``replicate`` ranks holding that shard).
    The second part is what crosses nodes when replicas are placed one per node."""
    return all_gather(nbytes, shard), all_reduce(nbytes / shard, replicate)


def compute_bytes(plan: Plan) -> int:
    """Bytes of one 16-bit (or fp32) activation / parameter element as the step computes."""
    return 4 if plan.run.precision == "fp32" else 2


def param_tensors(plan: Plan) -> int:
    """Parameter tensors on one rank (bookkeeping that runs once per tensor: hooks, copies)."""
    m = describe_model(plan.model)
    return ceil(m.block_param_tensors() * m.layers / plan.pp) + m.end_param_tensors()


def reduced_in(grad_elem: float) -> Optional[str]:
    """What gradient sums of ``grad_elem`` bytes an element are in: fp32, 16bit, or mixed (some in 16 bit, the rest
    in fp32: DeepSpeed's torch_autocast); None without a reduction."""
    if not grad_elem:
        return None
    return "fp32" if grad_elem >= 4 else "16bit" if grad_elem <= 2 else "mixed"


def buckets(nbytes: float, bucket_bytes: float) -> int:
    """Collectives of a bucketed reduction."""
    return max(1, ceil(nbytes / max(bucket_bytes, 1.0))) if nbytes > 0 else 0


def tp_activation(plan: Plan, backward: float = 2) -> dict[str, float]:
    """Tensor parallelism: per layer and micro-batch, two all-reduces of the b x s x d activation (s: the rank's
    tokens, seq_len / cp) in forward (after the row-parallel o_proj and MLP output) and ``backward`` in backward, one
    per distinct input the column-parallel projections read: two in Megatron's f / g (its fused qkv and fc1;
    sequence parallelism moves the same bytes as gathers + scatters)."""
    if plan.tp == 1:
        return {}
    m = plan.model
    layers = m.n_layers / plan.pp * plan.grad_accum
    act = local_tokens(plan) * m.d_model * compute_bytes(plan)
    return {"activation": (2 + backward) * layers * all_reduce(act, plan.tp), "collectives": (2 + backward) * layers}


def torch_tp(plan: Plan) -> dict[str, float]:
    """torch-native tensor parallelism (bench/parallel/tp.py), counted as torch runs it (tests/test_tp_traffic.py
    counts a real gloo step with CommDebugMode).  Backward: the attention's input is one DTensor (PrepareModuleInput),
    so q / k / v's input gradients are summed locally and all-reduced once; the MLP's input is prepared only under
    torchao's float8 styles (PrepareFloat8ModuleInput), elsewhere each column-parallel MLP projection makes its own
    DTensor of the input and all-reduces its input gradient on its own: llama's gate and up, two.  Tensorwise float8
    under TP: each float8 cast of a sharded tensor all-reduces its amax (a scalar, latency only) over tp: forward the
    row-parallel layers' inputs (2), backward the column-parallel layers' output gradients (3 + the MLP's input
    projections), and each converted weight's cast forward and backward (7 + 7 for llama) unless FSDP2 precomputes
    the weights' scales after the step (bench/parallel/float8.py)."""
    if plan.tp == 1:
        return {}
    from bench.parallel.float8 import float8_tp, precomputes_scales

    mlp_in = describe_model(plan.model).mlp_inputs
    f8 = float8_tp(plan) and float8_blocks_converted(plan)
    out = tp_activation(plan, backward=1 + (1 if f8 else mlp_in))
    if f8:
        layers = plan.model.n_layers / plan.pp * plan.grad_accum
        weights = 0 if precomputes_scales(plan) else 2 * (4 + mlp_in + 1)
        out["scalar_collectives"] = layers * (2 + 3 + mlp_in + weights)
    return out


def float8_blocks_converted(plan: Plan) -> bool:
    """Every projection of a block is a Float8Linear under this tp: their in / out features per shard are multiples
    of 16 (bench/parallel/float8.py ``bf16_reason``), so the float8 styles shard them all."""
    from types import SimpleNamespace

    from bench.parallel.float8 import bf16_reason

    m = describe_model(plan.model)
    shapes = [(m.d, m.d), (m.d, m.kv_dim), (m.d, m.ff), (m.ff, m.d)]
    return all(bf16_reason(SimpleNamespace(in_features=i, out_features=o), "blocks.0.x", plan.tp) is None
               for i, o in shapes)


def local_tokens(plan: Plan) -> int:
    """Tokens of one micro-batch on one rank: b sequences of seq_len / cp (context parallelism shards each)."""
    return plan.micro_batch_size * plan.model.seq_len // plan.cp


def kv_bytes(plan: Plan) -> float:
    """One layer's K and V over the whole sequence of a micro-batch, as attention computes (the rank's kv heads
    under tp): what context parallelism's all-gather assembles on every rank of the cp group."""
    kv_dim = describe_model(plan.model).kv_dim / plan.tp
    return 2 * plan.micro_batch_size * plan.model.seq_len * kv_dim * compute_bytes(plan)


# torch's ring attention accumulates dK / dV in fp32 (_cp_options.convert_to_f32) while they travel the ring
RING_GRAD_BYTES = 4


def cp_kv_exchange(plan: Plan) -> dict[str, float]:
    """Context parallelism (bench/parallel/cp.py, torch's ring attention with ROTATE = "allgather"), per layer and
    micro-batch: forward, each rank's K and V (concatenated) all-gathered once, (cp-1)/cp of ``kv_bytes`` received;
    backward, gathered again, and dK / dV (fp32, the rank's own chunk's size) passed around the ring once per chunk,
    cp hops (torch's backward always rotates them point to point, whatever ROTATE says: ``_AllToAllRotater``); a
    recomputed forward (recompute=full's checkpointed blocks, selective's attention core) gathers again.  The
    gather is issued before attention and waited on right after the local chunk's attention, the gradients each
    hop: counted exposed, not overlapped."""
    cp = plan.cp
    if cp == 1:
        return {}
    layers = plan.model.n_layers / plan.pp
    recomputed = layers if plan.layout.recompute == "selective" else plan.layout.checkpointed(layers)
    kv = kv_bytes(plan)
    grads = kv * RING_GRAD_BYTES / compute_bytes(plan)  # cp hops of 1/cp of K / V's size, in fp32
    gathers = 2 * layers + recomputed
    return {"context": plan.grad_accum * (gathers * all_gather(kv, cp) + layers * grads),
            "collectives": plan.grad_accum * (gathers + layers * cp)}


def pp_p2p(plan: Plan) -> dict[str, float]:
    """Pipeline: each micro-batch sends its activation forward and receives its gradient back at every
    stage boundary (``virtual`` chunks per rank multiply the boundaries)."""
    if plan.pp == 1:
        return {}
    m = plan.model
    v = plan.layout.virtual_pipeline
    act = plan.micro_batch_size * m.seq_len * m.d_model * compute_bytes(plan)
    sends = 2 * plan.grad_accum * v
    return {"p2p": sends * act, "collectives": 2 * sends}


def torch_native_hooks(plan: Plan) -> dict[str, float]:
    """torch-native model parallelism's host work: DTensor dispatch of every op of a tensor-parallel layer,
    and the pipeline schedule's forward, backward, send and receive per micro-batch and local stage.  Device: its
    tensor parallelism keeps the output head replicated (bench/parallel/tp.py), so every tp rank runs the whole
    head's forward and backward for its tokens: (tp - 1) / world of the head's FLOPs beyond the rank's share."""
    out: dict[str, float] = {"layer_host": DTENSOR_LAYER_HOST} if plan.tp > 1 else {}
    if plan.tp > 1:
        m = plan.model
        out["extra_flops"] = (6.0 * m.d_model * m.vocab_size * m.global_batch * m.seq_len
                              * (plan.tp - 1) / plan.world_size)
    if plan.pp > 1:  # compiled stages save no host time under the schedule (300m, PP=2, 2 x H200: 146-209 ms
        # a step eager, 203-274 compiled; results/2026-11-22-h200x2-model-parallel, -forkserver-graphs, -x4-followups)
        out.update(hooks=4 * plan.grad_accum * plan.layout.virtual_pipeline, eager=1)
    return out


def merge(*parts: dict) -> dict[str, float]:
    """Sum traffic dicts key by key (FLAGS: the largest wins)."""
    out: dict[str, float] = {}
    for p in parts:
        for k, v in p.items():
            out[k] = max(out.get(k, 0.0), v) if k in FLAGS else out.get(k, 0.0) + v
    return out

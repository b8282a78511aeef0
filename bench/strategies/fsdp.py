"""``fsdp``: PyTorch FSDP2 (``fully_shard``) over the data-parallel ranks, alone or over a
tensor-parallel (``strategy.tp``) and / or pipelined (``strategy.pp``) model: torchtitan's 2-D and
3-D layouts; ``strategy.dp_replicate`` > 1 is HSDP (shard inside a replica, replicate across: the usual
answer to a thin network).  The steps are in bench/parallel (dp.apply_fsdp holds the wrapping rules)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bench.spec.layout_rules import check_torch_native
from bench.spec.schema import AddedLayoutKnobs, BenchConfig, ConfigError, Plan, knob
from bench.strategies.registry import FP32, ModelStates, Scheme, StrategySpec, register, torch_native_over
from bench.parallel.float8 import fsdp_float8_all_gather, precomputes_scales
from bench.metrics.flops import float8_matmul_params
from bench.costs.activations import params_per_rank
from bench.models.model_spec import describe_model
from bench.costs.traffic import (all_gather, compute_bytes, cp_kv_exchange, hsdp_grad_reduce, merge, param_tensors,
                           pp_p2p, torch_native_hooks, torch_tp)

# torchao's eager weight cast before a float8 all-gather, bytes an element: the scale's multiply (fp32 in, fp32
# out), the clamp (the same) and the float8 copy (fp32 in, 1 B out); the precomputed scales' amax reads 4 B
FLOAT8_WEIGHT_CAST_BYTES = 8 + 8 + 5
FLOAT8_AMAX_BYTES = 4
# ...and its host work, in framework host operations (``hooks``) a weight a gather: the cast's Python (torchao's
# float8 constructor, its tensor subclass) and its three eager kernels.  Measured on rank 0 of Llama 3.2 1B, FSDP2
# TP=2 x DP=2, 112 converted weights gathered once a step: 98.6-100.2 ms of host work a step with the float8
# all-gather, 88.4 without, about 0.1 ms a weight, 3 of the calibration's per_hook (results/2026-12-06-h100x1-fake-ranks)
FLOAT8_CAST_HOOKS = 3


@dataclass
class FSDPConfig(AddedLayoutKnobs):
    """PyTorch FSDP2 knobs (defaults are torch's); tp, pp and the pipeline's knobs: bench/spec/schema.py."""

    name: str = "fsdp"
    reshard_after_forward: bool = knob(True, "true: free a unit's gathered parameters after its forward, gather "
                                       "again in backward (ZeRO-3 analogue, least memory); false: keep them to "
                                       "backward (ZeRO-2 analogue, one all-gather per unit per step)", tune=(True, False))
    reduce_dtype: str = knob("fp32", "gradient reduce-scatter dtype under bf16/fp16: fp32 | param (half the bytes, "
                             "lower-precision sums)", choices=("fp32", "param"))
    cpu_offload: bool = knob(False, "CPUOffloadPolicy: sharded parameters, gradients and the optimizer step on the "
                             "host (memory for PCIe traffic and a CPU AdamW)", fallback=(False, True))
    prefetch: int = knob(0, "0: FSDP2's implicit prefetching; k >= 1: the next k units' all-gathers issued early "
                         "(k extra gathered units alive)")
    blocks_per_unit: int = knob(1, "consecutive blocks per FSDP unit: k > 1 means k times fewer, larger collectives "
                                "and hooks (host time), k blocks' gathered parameters alive at once",
                                tune=(1, 4, 8), added=True)
    fp8_all_gather: bool = knob(True, "precision=fp8 with fp8_recipe=tensorwise: all-gather the converted weights in "
                                "float8 (torchao's enable_fsdp_float8_all_gather: half the bytes of bf16), each "
                                "rank's shard cast in eager kernels before each gather; false: gather bf16, the "
                                "compiled blocks cast (fused). On one H200 (one shard, nothing to gather), 8B-wide "
                                "blocks: false 4-7% faster (results/2026-12-02-h200x1-fp8-kernels); tuning=best "
                                "turns it off on one shard", added=True)
    fp8_precompute_scale: bool = knob(True, "with fp8_all_gather: every float8 weight's scale in one all-reduce after "
                                      "the optimizer step (torchao's precompute_float8_dynamic_scale_for_fsdp), not "
                                      "one per weight at each gather", added=True)
    dp_replicate: int = knob(1, "HSDP: the data-parallel ranks as dp_replicate replicas x dp / dp_replicate shards "
                             "(FSDP2 over a 2-D mesh, torchtitan's data_parallel_replicate_degree): states sharded "
                             "within a replica, gradient shards all-reduced across replicas; must divide dp "
                             "(= world_size / (tp x pp)); 1: plain FSDP", added=True, tune_nodes=True)
    sync_every_microbatch: bool = knob(False, "with gradient accumulation: reduce-scatter the gradients after every "
                                       "micro-batch (torchtitan's default), keeping only sharded gradients, at m x "
                                       "the reduce-scatters; false: gradient sync on the last micro-batch only, "
                                       "FSDP2 then holds every parameter's unsharded gradient in the reduce dtype "
                                       "between micro-batches (Llama-3 8B on 4 ranks: 30 GiB)", added=True,
                                       tune=(False, True))


def _float8_rules(plan: Plan) -> None:
    """The float8 knobs act only under precision=fp8 with tensorwise scaling (torchao's float8 all-gather takes
    one scale per tensor), the scales only with the float8 all-gather: turned off elsewhere they would change
    nothing, so that is refused."""
    s, run = plan.strategy, plan.run
    tensorwise = run.precision == "fp8" and run.fp8_recipe == "tensorwise"
    for key in ("fp8_all_gather", "fp8_precompute_scale"):
        if not tensorwise and not getattr(s, key):
            raise ConfigError(f"strategy.{key}", False, f"takes effect only with precision=fp8 fp8_recipe=tensorwise "
                              f"(precision={run.precision}, fp8_recipe={run.fp8_recipe}); leave "
                              f"strategy.{key}=true (the default) or use precision=fp8 fp8_recipe=tensorwise")
    if tensorwise and not s.fp8_all_gather and not s.fp8_precompute_scale:
        raise ConfigError("strategy.fp8_precompute_scale", False, "takes effect only with strategy.fp8_all_gather="
                          "true (the scales are those of the float8 all-gather); leave it true or gather in float8")


def rules(plan: Plan) -> None:
    s, run = plan.strategy, plan.run
    if run.compile and run.compile_mode == "reduce-overhead":
        raise ConfigError("compile_mode", "reduce-overhead", "CUDA graphs of FSDP2's blocks ran 15-20x slower than "
                          "compile_mode=default; use compile_mode=default with strategy=fsdp "
                          "(strategy.blocks_per_unit > 1 cuts its host time instead)")
    check_torch_native(plan, shards_dtensors=True)
    n = plan.model.n_layers // (plan.pp * plan.layout.virtual_pipeline)
    if not 1 <= s.blocks_per_unit <= n:
        raise ConfigError("strategy.blocks_per_unit", s.blocks_per_unit,
                          f"must be 1..{n} (consecutive blocks per FSDP unit, within one pipeline stage of {n} blocks)")
    units = -(-n // s.blocks_per_unit)
    if not 0 <= s.prefetch <= units - 1:  # a unit prefetches only the units after it: more is a silent no-op
        raise ConfigError("strategy.prefetch", s.prefetch,
                          f"must be 0..{units - 1} (0: FSDP2's implicit prefetching, k: the next k units explicitly): "
                          f"strategy.blocks_per_unit={s.blocks_per_unit} makes {units} FSDP unit(s) of "
                          f"{n} blocks" + (", nothing to prefetch" if units == 1 else ""))
    if s.sync_every_microbatch and plan.pp > 1:
        raise ConfigError("strategy.sync_every_microbatch", True, "applies to FSDP2 without a pipeline (strategy.pp=1): "
                          "with pp > 1 torch's PipelineStage decides when gradients are reduced")
    if s.cpu_offload and (plan.tp > 1 or plan.pp > 1):
        raise ConfigError("strategy.cpu_offload", True, "is implemented for FSDP2 alone (strategy.tp=1, pp=1)")
    if s.reduce_dtype == "param" and run.precision == "fp32":  # no MixedPrecisionPolicy: the gradients are fp32
        raise ConfigError("strategy.reduce_dtype", "param", "takes effect only with precision=bf16, fp16 or fp8 (with "
                          "precision=fp32 the parameters, so the reduced gradients, are fp32 already); leave "
                          "strategy.reduce_dtype=fp32 (the default) or use precision=bf16")
    _float8_rules(plan)


def model_states(run: BenchConfig) -> ModelStates:
    s = run.strategy
    reshard, off = s.reshard_after_forward, s.cpu_offload
    # under bf16 / fp16 the fp32 shards are the master (4 + 4 + 8); + the gathered 16-bit parameters while gathered
    mixed = Scheme("fsdp_mixed", 4, 4, 8)
    return ModelStates(FP32 if run.precision == "fp32" else mixed, stage=3, offload_optimizer=off,
                       offload_grads=off, offload_param=off, unsharded_params_live=not reshard,
                       sixteen_bit_weights=True,  # MixedPrecisionPolicy gathers the parameters in 16 bit
                       # set_requires_gradient_sync(False) on all but the last micro-batch (bench/parallel/dp.py, and
                       # torch's PipelineStage): FSDP2 keeps every unsharded gradient, upcast to reduce_dtype
                       # (FSDPParam.to_accumulated_grad_if_needed); measured by tests/test_memory_tracker.py
                       accum_grad_bytes=0 if s.sync_every_microbatch else
                       4 if run.precision == "fp32" or s.reduce_dtype == "fp32" else 2,
                       note="FSDP2 reshard_after_forward=%s (%s analogue)" % (reshard, "ZeRO-3" if reshard else "ZeRO-2")
                       + (f"; HSDP: sharded over dp / {s.dp_replicate}, replicated {s.dp_replicate} times"
                          if s.dp_replicate > 1 else ""))


def buffers(plan: Plan, psi: float, per_block: float) -> tuple[float, str]:
    """With resharding: the gathered units in flight and the root's gathered parameters (embedding, final norm,
    head: the root never reshards, bench/parallel/dp.py); a unit's unsharded gradients are phase_buffers()'s."""
    s = plan.strategy
    if not s.reshard_after_forward:
        return 0.0, ""  # the gathered parameters are model states (ModelStates.unsharded_params_live)
    unit = per_block * s.blocks_per_unit
    # precision=fp8 with the float8 all-gather: the gathered weights are float8, 1 B each (norms counted too)
    cb = 4 if plan.run.precision == "fp32" else (1 if fsdp_float8_all_gather(plan) else 2)
    root = (psi - per_block * plan.model.n_layers / plan.pp) * (4 if cb == 4 else 2)  # the root gathers 16-bit
    # as many units as the stage has (one unit of every block has no next unit to gather)
    units = -(-plan.model.n_layers // (plan.pp * plan.layout.virtual_pipeline * s.blocks_per_unit))
    return min(2 + s.prefetch, units) * unit * cb + root, \
        "FSDP2: gathered units (current + next + prefetch), the root's parameters"


def phase_buffers(plan: Plan, psi: float, per_block: float) -> tuple[dict[str, float], str]:
    """In backward: the reduce-scatter of one unit's gradients, after that unit's backward.
    FSDPParamGroup.post_backward (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py) first reshards the unit
    (reshard_after_backward, torch's default: its gathered parameters freed), then calls foreach_reduce
    (_fsdp_collectives.py), which allocates the reduce-scatter input, the unit's whole unsharded gradients in
    reduce_dtype (MixedPrecisionPolicy.reduce_dtype: fp32 under bf16 / fp8 with strategy.reduce_dtype=fp32,
    bench/parallel/dp.py apply_fsdp), copies into it the gradients autograd made (param dtype) and frees those only
    after the copy: both alive at that allocation.  With gradient sync off (accumulation) the gradients reduced are
    the accumulated ones, already counted (ModelStates.accum_grad_bytes).  One unit's input at a time: post_backward
    waits on the previous unit's reduce-scatter event and drops its input before its own foreach_reduce
    (comm_ctx.reduce_scatter_state; newer torch: reduce_scatter_states, at most reduce_scatter_max_input_buffers, 1
    unless set_reduce_scatter_max_input_buffers raises it, which bench does not).  With resharding, buffers()' two
    gathered units are the unit's and the next's: the unit's are freed as above.  Counted at that moment, with the
    unit's blocks' activations freed, not beside all activations: over the recorded FSDP2 runs this took the plan's
    median error from 2.5% to 0.7% and Llama-3 8B's resharded 8-block units from 8-18% high to 2.5-5.8%
    (results/2026-12-02-h200x1-recompute-op)."""
    s, fp32 = plan.strategy, plan.run.precision == "fp32"
    reduce_bytes = 4 if fp32 or s.reduce_dtype == "fp32" else 2
    accumulated = plan.grad_accum > 1 and not s.sync_every_microbatch and not s.cpu_offload
    grad_bytes = 0 if accumulated else 4 if fp32 else 2
    end = _root_reduce(plan, psi, per_block, reduce_bytes + grad_bytes - (4 if fp32 else 2))
    gathered = 4 if fp32 else (1 if fsdp_float8_all_gather(plan) else 2)  # as buffers() counts a gathered unit
    blocks = min(s.blocks_per_unit, plan.model.n_layers / (plan.pp * plan.layout.virtual_pipeline))
    return {"reduce": blocks * per_block * (reduce_bytes + grad_bytes - gathered), "reduce_blocks": blocks, **end}, \
        f"FSDP2: one unit's reduce-scatter input ({reduce_bytes} B a parameter) and the gradients copied into it " \
        f"({grad_bytes} B), less its gathered parameters ({gathered} B), after the backward of its {blocks:g} blocks"


def _root_reduce(plan: Plan, psi: float, per_block: float, net_bytes: float) -> dict[str, float]:
    """The root's reduce-scatter (embeddings, final norm, head), the backward's last, as a unit's above: its input
    and the gradients copied into it, less its gathered 16-bit parameters (resharded first), beside the gradients
    and no activation.  Counted with loss_chunks > 1 only: unchunked, the loss' logits buffers (12 B a logit)
    outweigh it in the runs recorded so far (their plans stay as they were); chunked they may not (torch's
    FSDPMemTracker, tests/test_memory_tracker.py: a 152k vocabulary at 256 tokens a rank)."""
    if plan.layout.loss_chunks == 1 or plan.strategy.cpu_offload:
        return {}
    return {"end": (psi - per_block * plan.model.n_layers / plan.pp) * net_bytes}


# without resharding, FSDP2 is "tight" above this share of the device's memory allocated (planned): 4 x H100 80GB,
# Llama-3 8B, units of 8 blocks without resharding planned at 68-85% of the card: the caching allocator reserved
# 75-77 GiB, retried cudaMalloc 9-21 times in 10 steps and the steps ran 1.2-2.8x slower than with resharding at the
# same allocated peak; planned at 64-65% they ran at full speed (results/2026-11-28-h100x4-llama8b-memory-knobs,
# results/2026-11-27-h100x4-edge)
ALLOCATOR_HEADROOM = 0.65


def crowded(plan: Plan, allocated: float, mem_gib: Optional[float]) -> Optional[str]:
    if not mem_gib or plan.strategy.reshard_after_forward:
        return None
    share = allocated / 2**30 / mem_gib
    if share <= ALLOCATOR_HEADROOM:
        return None
    return (f"FSDP2 without resharding at {share:.0%} of the device allocated (above {ALLOCATOR_HEADROOM:.0%}): "
            "measured there, the caching allocator retried at the device's limit and the steps ran 1.2-2.8x slower "
            "(results/2026-11-28-h100x4-llama8b-memory-knobs)")


def traffic(plan: Plan, params: float) -> dict[str, float]:
    """Per micro-batch each unit's 16-bit parameters are gathered for forward (and again for backward when
    resharding), prefetched ahead of use; the gradients are reduce-scattered once per step (no gradient sync on
    the other micro-batches).  Host: four hooks per unit per micro-batch; per parameter, a DTensor made at each
    gather, its gradient's share of the reduce-scatter and its dispatch in the optimizer.  With cpu_offload the
    shards cross PCIe and AdamW runs on the host.  HSDP: the gathers and reduce-scatters over the shard group
    (dp / dp_replicate ranks), then each unit's gradient shard all-reduced over the replicas.  Context parallelism:
    the states sharded over dp x cp (the gathers and reduce-scatters over that group), and the K / V exchange."""
    s, m, lay = plan.strategy, plan.grad_accum, plan.layout
    dp, replicate, v = lay.state_shards, lay.dp_replicate, lay.virtual_pipeline
    per_chunk = -(-plan.model.n_layers // (plan.pp * v * s.blocks_per_unit))
    units = v * per_chunk + 1  # + the root
    gathers = m * (2 if s.reshard_after_forward else 1)
    grad_bytes = 4 if s.reduce_dtype == "fp32" or plan.run.precision == "fp32" else 2
    syncs = m if s.sync_every_microbatch and plan.pp == 1 else 1  # reduce-scatters per step
    scatter, across = (syncs * b for b in hsdp_grad_reduce(params * grad_bytes, dp, replicate))
    own = {"param_gather": _gathered(plan, params), "grad_reduce": scatter, "device_bytes": _weight_casts(plan),
           "collectives": units * (gathers + syncs * (1 + (replicate > 1))),
           "hooks": 4 * units * m + param_tensors(plan) * (gathers + 2) + _weight_cast_hooks(plan),
           **({"grad_elem": grad_bytes} if dp * replicate > 1 else {})}
    if replicate > 1:  # over the replicate group (bench/plan/topology.py KIND_GROUP), the rest over the shard group
        own["grad_replicate"] = across
    if s.cpu_offload:  # fp32 shards in (per gather) and gradients out, the AdamW step on the host
        own.update(offload=4 * params / dp * (gathers + 1), host_adam=params / dp)
    return merge(own, torch_tp(plan), pp_p2p(plan), cp_kv_exchange(plan), torch_native_hooks(plan))


def _gathered(plan: Plan, params: float) -> float:
    """Bytes one rank sends in a step's parameter all-gathers (tests/test_tp_traffic.py counts a real gloo step with
    CommDebugMode).  Every micro-batch gathers each unit for its forward and, resharding, again for its backward,
    except each chunk's last unit, which never reshards (bench/parallel/dp.py apply_fsdp); the root (embeddings,
    final norm, head) never reshards after forward and is gathered once a micro-batch (resharded after backward).
    Under the float8 all-gather only the converted blocks' weights travel as float8 (1 B): the root and the norms
    stay 16-bit (torchao casts Float8Linear weights only; the head is left in bf16)."""
    blocks = params_per_rank(plan, False)["blocks"]
    root = params - blocks
    cb = compute_bytes(plan)
    block_bytes = blocks * cb
    if fsdp_float8_all_gather(plan):  # the converted weights at 1 B, the blocks' norms at 16 bit
        converted = _converted(plan)
        block_bytes = converted + (blocks - converted) * cb
    return plan.grad_accum * all_gather(root * cb + _block_gathers(plan) * block_bytes, plan.layout.state_shards)


def _converted(plan: Plan) -> float:
    """The converted (Float8Linear) weights of the rank's blocks, unsharded."""
    return float8_matmul_params(plan.model) / plan.tp / plan.pp


def _block_gathers(plan: Plan) -> float:
    """How many times a micro-batch gathers the blocks, on average over them: once for forward, and, resharding,
    again for backward, except each chunk's last unit."""
    s, lay = plan.strategy, plan.layout
    n = plan.model.n_layers / plan.pp
    last_unit = min(s.blocks_per_unit, n / lay.virtual_pipeline) * lay.virtual_pipeline  # each chunk's last unit
    return 1 + ((n - last_unit) / n if s.reshard_after_forward else 0.0)


def _weight_casts(plan: Plan) -> float:
    """HBM bytes of the float8 all-gather's weight casts in a step: before each gather torchao casts the rank's fp32
    shard of every converted weight to float8 in eager ops (scale, clamp, cast: FLOAT8_WEIGHT_CAST_BYTES an
    element), and with its precomputed scales reads every shard once after the optimizer step for their amax
    (results/2026-12-02-h200x1-fp8-kernels: those kernels, and how often they ran, in an H200's traces)."""
    if not fsdp_float8_all_gather(plan):
        return 0.0
    shard = _converted(plan) / plan.layout.state_shards
    amax = FLOAT8_AMAX_BYTES * shard if precomputes_scales(plan) else 0.0
    return FLOAT8_WEIGHT_CAST_BYTES * shard * _block_gathers(plan) * plan.grad_accum + amax


def _weight_cast_hooks(plan: Plan) -> float:
    """Host operations of the float8 all-gather's weight casts in a step (FLOAT8_CAST_HOOKS a weight a gather)."""
    if not fsdp_float8_all_gather(plan):
        return 0.0
    weights = len(describe_model(plan.model).block_matmuls()) * plan.model.n_layers / plan.pp
    return FLOAT8_CAST_HOOKS * weights * _block_gathers(plan) * plan.grad_accum


def _gathers_nothing(plan: Plan) -> Optional[str]:
    """The float8 all-gather off only where the weights are not sharded: there is nothing to gather, and its eager
    weight casts (``_weight_casts``) are all it does; sharded, it halves the bytes every gather sends."""
    n = plan.layout.state_shards
    return None if n == 1 else (f"the weights are sharded over {n} ranks: the float8 all-gather halves the bytes "
                                f"each gather sends (measured off on one shard only)")


def label(name: str, v: dict) -> list[str]:
    r = v.get("dp_replicate", 1)
    return [name] + ([f"dp_replicate={r}"] if isinstance(r, int) and r > 1 else []) + \
        (["cpu_offload"] if v.get("cpu_offload") is True else [])


SPEC = register(StrategySpec(
    name="fsdp", schema=FSDPConfig, summary="PyTorch FSDP2 (fully_shard), alone or over torch TP / PP",
    implementation=torch_native_over("FSDP2"), rules=rules, model_states=model_states, buffers=buffers,
    phase_buffers=phase_buffers, crowded=crowded, label=label, traffic=traffic, float8=True, loss_chunks=True,
    grad_reduce={"fp32": ("strategy.reduce_dtype", "fp32"), "16bit": ("strategy.reduce_dtype", "param")},
    profiles={"best": {
        # compile first: it costs no memory (Inductor casts a norm's output once for all its projections), so the
        # knobs that trade memory for speed after it are judged against the compiled plan, not the eager one
        "compile": (True, "one H200, 300m batch 8: compiled units of 4 92.1k vs eager 65.7k tokens/s "
                          "(results/2026-11-23-h200-fsdp2-tp-host)"),
        "strategy.blocks_per_unit": (8, "2 x H200, 300m, global batch 16, compiled: units of 8 beat 4 and 24 twice "
                                        "within one call, 76.2% / 67.1% of 2 x single without / with resharding "
                                        "(results/2026-11-23-h200x2-zero-grad-norm-fsdp)"),
        "strategy.reshard_after_forward": (False, "2 x H200, 300m: 76.2% vs 67.1% of 2 x single (more memory: "
                                                  "the gathered parameters live to backward) "
                                                  "(results/2026-11-23-h200x2-zero-grad-norm-fsdp)"),
        "strategy.fp8_all_gather": (False, "one H200, 8B-wide blocks, fp8 on one shard: 6.7% / 4.3% faster without "
                                           "the float8 all-gather, resharded / not "
                                           "(results/2026-12-02-h200x1-fp8-kernels)", _gathers_nothing),
    }},
))

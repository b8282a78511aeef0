"""``ddp``: torch DistributedDataParallel, one replica per rank, each rank on its slice of the global
batch; gradients all-reduced in buckets overlapped with backward."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from bench.spec.schema import BenchConfig, ConfigError, Plan, StrategyConfig, fields_of, knob
from bench.strategies.registry import ModelStates, StrategySpec, register, replicated_states, torch_native_over
from bench.strategies.single import REDUCE_OVERHEAD
from bench.parallel.compile import refuse_graphs_across_microbatches
from bench.costs.traffic import all_reduce, buckets


@dataclass
class DDPConfig(StrategyConfig):
    """torch DistributedDataParallel knobs (defaults are torch's)."""

    name: str = "ddp"
    bucket_cap_mb: float = knob(25.0, "gradient bucket size (MB): larger = fewer all-reduces, later overlap",
                                tune=(25.0, 100.0))
    gradient_as_bucket_view: bool = knob(True, "gradients are views into the buckets (no copy)")
    static_graph: bool = knob(False, "DDP may cache the used-parameter set and bucket order after step 1")
    comm_hook: str = knob("none", "bf16_compress | fp16_compress: all-reduce gradients in 16 bit (half the bytes)",
                          choices=("none", "bf16_compress", "fp16_compress"))


def _several_ranks(plan: Plan) -> Optional[str]:
    if plan.world_size > 1:
        return ("measured on 1 rank only: at 2 ranks eager DDP ran at 80-84% of 2 x single, compiled DDP at 60.5% "
                "of 2 x compiled single (2 x H200, results/2026-11-23-h200x2-zero-fsdp-tp-pp)")
    return None


def rules(plan: Plan) -> None:
    s = plan.strategy
    if s.bucket_cap_mb <= 0:
        raise ConfigError("strategy.bucket_cap_mb", s.bucket_cap_mb, "must be > 0")
    refuse_graphs_across_microbatches(plan)
    if plan.dp_size == 1:  # one replica: DDP wraps nothing and the step is single's, so its own knobs would not run
        common = fields_of(StrategyConfig)  # (micro_batch_size still accumulates)
        for name, f in fields_of(DDPConfig).items():
            value = getattr(s, name)
            if name not in common and value != f.default:
                raise ConfigError(f"strategy.{name}", value, f"does nothing at world_size=1 (one replica: DDP "
                                  f"wraps nothing, the step is single's); use world_size > 1 or {f.default}")
    if s.comm_hook == "bf16_compress" and plan.device != "cuda":
        raise ConfigError("strategy.comm_hook", s.comm_hook, "needs NCCL (a GPU); on CPU use none or fp16_compress")


# a compress hook's own work a bucket (torch's default_hooks._compress_hook): its Python call, the cast to 16 bit,
# the division, the callback's copy back; and a parameter's HBM bytes beyond the reducer's own fp32 division (4 + 4):
# the cast (4 read + 2 written), the division in 16 bit (2 + 2), the copy back (2 + 4)
COMPRESS_HOOK_OPS, COMPRESS_HOOK_BYTES = 4, (4 + 2) + (2 + 2) + (2 + 4) - (4 + 4)


def traffic(plan: Plan, params: float) -> dict[str, float]:
    """One all-reduce of the gradients per step (no_sync on the other micro-batches), bucket by bucket during
    the last backward; fp32 gradients (the weights are fp32 under autocast) unless a compress hook halves them
    (its buckets are still the fp32 gradients', its casts cost HBM bytes and host work).  The reducer is C++: no
    Python hooks per parameter."""
    if plan.dp_size == 1:
        return {}
    s = plan.strategy
    elem = 2 if s.comm_hook != "none" else 4
    calls = buckets(4 * params, s.bucket_cap_mb * 2**20)
    own = {"grad_reduce": all_reduce(params * elem, plan.dp_size), "collectives": calls, "grad_elem": elem}
    if s.comm_hook != "none":
        own.update(hooks=COMPRESS_HOOK_OPS * calls, device_bytes=COMPRESS_HOOK_BYTES * params)
    return own


def model_states(run: BenchConfig) -> ModelStates:
    """single's states; on several ranks with gradient_as_bucket_view the gradients are views into the
    reducer's buckets, allocated when DDP wraps the model: alive through the forward too."""
    lay = replicated_states(run)
    views = run.world_size > 1 and run.strategy.gradient_as_bucket_view
    return dataclasses.replace(lay, grads_live=views, note=lay.note + ("; DDP: gradients are bucket views" if views else ""))


def bucket_bytes(plan: Plan, psi: float, views: bool, rebuilds: bool) -> tuple[float, str]:
    """torch DDP's reducer over psi fp32 gradients (dp > 1): its flat bucket tensors (4 B/param; with
    gradient_as_bucket_view they are the gradients, counted as model states), and, where DDP rebuilds its buckets
    in gradient-ready order at step 2's forward (not with find_unused_parameters), the first step's buckets
    (4 B/param): they are freed only once the process group lets go of step 1's completed all-reduce works,
    asynchronously, so both sets can be alive at step 2's peak.  A 2 x H200 probe (300m bf16, batch 8): DDP's
    step peaks 14035 MiB = one rank's 12814 + 4 B/param, step 2 15255 (+8 B/param) on 3 of 4 ranks, never with a
    2 s pause after step 1; recorded runs: the largest rank 8 B/param over single's in 35 of 37 runs of 2-4 ranks
    (the other two, 1b, 4: results/2026-11-22-h200x4-paper-sweeps, results/2026-11-23-h200x2-cpu-affinity)."""
    if plan.dp_size == 1:
        return 0.0, ""
    own = 0.0 if views else 4 * psi
    old = 4 * psi if rebuilds else 0.0
    return own + old, "DDP gradient buckets" + (" + the first step's buckets until rebuilt" if rebuilds else "")


def buffers(plan: Plan, psi: float, per_block: float) -> tuple[float, str]:
    return bucket_bytes(plan, psi, views=plan.strategy.gradient_as_bucket_view, rebuilds=True)


def phase_buffers(plan: Plan, psi: float, per_block: float) -> tuple[dict[str, float], str]:
    """With gradient_as_bucket_view and accumulation, the first micro-batches' own gradients (4 B/param, fp32 like the
    weights), beside the buckets: the step zeroes gradients to None (bench/strategies/torch_native.py), and under
    no_sync the reducer's hooks do not run, so autograd's AccumulateGrad stores each gradient as a new tensor, not in
    its bucket view.  They live through the last micro-batch's forward and loss; its backward copies each into its
    bucket view (reducer.cpp mark_variable_ready_dense: grad = bucket_view) and frees it.  Without bucket views the
    gradients are the only copy (accumulated in place, copied into the buckets): nothing more.  Gemma-2B, 4 x H100,
    micro-batch 1 x 2 (results/2026-11-28-h100x4-slow-links-planner): planned 9.3 GiB short without them; torch's
    MemTracker sees them (tests/test_memory_tracker.py)."""
    if plan.dp_size == 1 or plan.grad_accum == 1 or not plan.strategy.gradient_as_bucket_view:
        return {}, ""
    return {"pass": 4 * psi}, "the first micro-batch's gradients (no_sync), beside the bucket views"


SPEC = register(StrategySpec(
    name="ddp", schema=DDPConfig, summary="torch DistributedDataParallel: replicas, bucketed all-reduce",
    implementation=torch_native_over("TorchDDP"), rules=rules, traffic=traffic,
    model_states=model_states, buffers=buffers, phase_buffers=phase_buffers, float8=True, loss_chunks=True,
    grad_reduce={"fp32": ("strategy.comm_hook", "none"), "16bit": (
        "strategy.comm_hook", lambda precision: f"{'fp16' if precision == 'fp16' else 'bf16'}_compress")},
    profiles={"best": {
        # one rank is single's step: single's compiled CUDA-graph profile holds; on several ranks it does not
        "compile": (True, "1 x H100, 1 rank: gpt2 94.6k -> 156.4k tokens/s, 300m 153.1k -> 195.0k "
                          "(results/2026-11-25-h100-search-1gpu)", _several_ranks),
        "compile_mode": ("reduce-overhead", REDUCE_OVERHEAD, _several_ranks),
    }},
))

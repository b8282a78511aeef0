"""What must fit on the device beyond the allocated peak, and the verdict (bench/plan/memory_model.py's plan).

needed = allocated peak x (1 + FRAGMENTATION)          the caching allocator's reserved-over-allocated
       + CUDA graph private pools                       a captured step's activations and temporaries
       + CONTEXT_BYTES + NCCL_COMM_BYTES x communicators device memory outside PyTorch's allocator

The verdict is right both ways only with the plan's error on both sides: "does not fit" when even an allocated
peak TIGHT_BELOW under the plan's would not fit; "fits" when one TIGHT above it would;
"tight" between the two (it may run or run out of memory: it is launched, with a warning).  Each constant says
where its number comes from.
"""
from __future__ import annotations

from typing import Optional

from bench.spec.schema import Plan

GIB = 2**30
# the plan over-predicts a measured peak rarely and by little (it under-predicts more often, by more): measured
# below planned by more than 5% in 1% of the 901 completed GPU runs in results/ (multirun_analysis.prediction,
# 2026-11-27); a plan above the limit by less than that may still run: tight, not "does not fit"
TIGHT_BELOW = 0.05
# reserved / allocated - 1 near the limit: the median over the 918 completed GPU runs in results/ is 3%
# (max_reserved_mb / max_allocated_mb); near the limit the allocator frees its cached blocks and retries before
# failing, so what it cannot give back (inactive split blocks) is what must fit, not the tail of runs far below it
FRAGMENTATION = 0.05
# the plan's error against measured peaks (python -m multirun_analysis.prediction results/, 2026-11-26: 97.7% of
# 810 completed GPU runs within 10%; bench/plan/memory_model.py's docstring): a plan this close to the limit is tight
TIGHT = 0.10
# one process's CUDA context, cuBLAS / cuDNN handles and kernels, outside the caching allocator: NVML used minus
# max_memory_reserved of one-GPU runs in results/ (single, ddp, fsdp at world_size 1 on H200): 1.77-1.90 GiB
CONTEXT_BYTES = 1.9 * GIB
# one NCCL communicator's buffers (channels x peers x protocol buffers): what a world_size 2 run adds over a
# world_size 1 run of the same strategy in results/ (NVML used - reserved): torch DDP / FSDP2 0.28 GiB, DeepSpeed
# 0.38, Megatron 0.37 (dp=2) to 0.55 (tp=2 x dp=2: two groups); the largest per group, rounded up
NCCL_COMM_BYTES = 0.4 * GIB
# a captured step's private pool beyond the eager peak, as a share of the captured forward-backward's transient
# memory (near the limit the allocator frees the eager pool's cached blocks for the capture, so only what the pool
# keeps apart is extra): Llama-3 8B, Megatron tp=4 on 4 x H200 (results/2026-11-26-h200x4-llama8b) reserved 11.5 GiB
# over allocated with strategy.cuda_graph=true against 2.2 GiB without, 9.3 GiB = 17% of the 56 GiB captured
GRAPH_POOL_SHARE = 0.2
# each further micro-batch captured in the same graph (a strategy's own capture of the whole step): Megatron tp=2 x
# dp=2, Llama-3 8B on 4 x H100 (results/2026-11-27-h100x4-edge, megatron_capture) ran out of memory in the capture
# with 16.7 GiB (2 x 4) and 24.3 GiB (1 x 8) reserved beyond the allocated peak, 1.19 and 3.47 x one micro-batch's
# captured memory: lower bounds (the capture wanted more), which 0.2 + 0.47 (m - 1) covers.  Not torch.compile's
# reduce-overhead: it graphs each compiled block, and every micro-batch replays the same graphs in the same pool
# (ZeRO-2, Llama 3.2 1B at 4 x 2 on one H100: NVML 55.5-57.4 GiB with graphs, 59.7 without; planned 68.3 with this
# term; results/2026-12-06-h100x1-zero-best, results/2026-12-06-h100x1-graphs-and-host)
GRAPH_POOL_PER_MICROBATCH = 0.47


def communicators(plan: Plan, extra: int) -> int:
    """NCCL communicators a rank creates: one per layout dimension of more than one rank (dp, tp; with context
    parallelism the cp ring and FSDP2's flattened dp x cp group in place of dp's), two for a pipeline (its group and
    the neighbours' send / receive pair), plus the implementation's own (``extra``: ModelStates.extra_communicators).
    Gloo (CPU) has none on a device."""
    if plan.device != "cuda":
        return 0
    return (plan.dp_size * plan.cp > 1) + (plan.cp > 1) + (plan.tp > 1) + 2 * (plan.pp > 1) + extra


def outside_allocator_bytes(plan: Plan, extra_communicators: int) -> float:
    """Device memory outside PyTorch's caching allocator: the CUDA context and the NCCL communicators."""
    if plan.device != "cuda":
        return 0.0
    return CONTEXT_BYTES + NCCL_COMM_BYTES * communicators(plan, extra_communicators)


def captures_step(plan: Plan, graph_pool: bool) -> bool:
    """The step runs from a CUDA graph (the strategy's own capture, ModelStates.cuda_graph_pool, or torch.compile's
    reduce-overhead mode), whose private pool is kept apart from the eager steps' cached blocks."""
    return graph_pool or bool(plan.run.compile and plan.run.compile_mode == "reduce-overhead")


def graph_pool_bytes(plan: Plan, graph_pool: bool, captured: float) -> float:
    """What a captured step's CUDA graph pool keeps beyond the eager peak: GRAPH_POOL_SHARE of one micro-batch's
    ``captured`` memory, and, where the strategy captures the whole step (``graph_pool``), GRAPH_POOL_PER_MICROBATCH
    more for each further micro-batch the same graph holds."""
    if not captures_step(plan, graph_pool):
        return 0.0
    further = plan.grad_accum - 1 if graph_pool else 0
    return (GRAPH_POOL_SHARE + GRAPH_POOL_PER_MICROBATCH * further) * captured


def verdict(allocated: float, extra: float, mem_gib: Optional[float]) -> dict:
    """needed = allocated x (1 + FRAGMENTATION) + extra (graph pools, context, communicators), and the same with an
    allocated peak TIGHT_BELOW under (best) and TIGHT above (worst) the plan's: does not fit when even the best exceeds the
    device's memory, tight when the worst would (``fits`` is true for both fits and tight: the run is launched)."""
    needed = allocated * (1 + FRAGMENTATION) + extra
    worst = allocated * (1 + TIGHT) * (1 + FRAGMENTATION) + extra
    best = allocated * (1 - TIGHT_BELOW) * (1 + FRAGMENTATION) + extra
    if mem_gib is None:
        return {"needed": needed, "worst": worst, "best": best, "fits": None, "tight": False}
    limit = mem_gib * GIB
    return {"needed": needed, "worst": worst, "best": best, "fits": best <= limit, "tight": best <= limit < worst}


def margins_text() -> str:
    """The allowances, in words (memory_plan's ``allowance``)."""
    return (f"+{round(100 * FRAGMENTATION)}% allocator fragmentation, CUDA graph pools where a step is captured, "
            f"+{CONTEXT_BYTES / GIB:.1f} GiB CUDA context, +{NCCL_COMM_BYTES / GIB:.1f} GiB per NCCL communicator; "
            f"tight: within the plan's error of the limit ({round(100 * TIGHT_BELOW)}% above it to "
            f"{round(100 * TIGHT)}% below)")

"""The per-rank loop: the only training loop in bench.

init process group and a first barrier (NCCL's buffers taken now) -> strategy.setup() -> warm-up steps
-> barrier -> timed steps (timed by CUDA events or a host sync after each: metrics.step_timing) -> per-rank
record -> rank 0 assembles and writes metrics.json.  A rank that raises writes ``failure_rank{r}.json`` (type, message,
traceback) before the exception leaves, so the launcher can tell the root cause from its collateral.
"""
from __future__ import annotations

import faulthandler
import gc
import logging
import os
import resource
import sys
import time
import traceback
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from bench import metrics
from bench.models.data import loss_note
from bench.jsonio import write_json_atomic
from bench.machine.placement import placement
from bench.machine.allocator import rank_env
from bench.metrics import provenance
from bench.metrics.memory import allocator_record
from bench.metrics.nvml import NvmlSampler
from bench.metrics.profile import profile_steps
from bench.metrics.timing import phase
from bench.parallel.compile import compile_counts, compile_record
from bench.strategies.registry import get_spec, grad_reduce_of, sweep_preloads
from bench.run.config import plan_from_dict
from bench.spec.schema import FaultConfig, Plan
from bench.strategies.base import DistContext
from bench.launch.outcome import oom_in_chain
from bench.launch.teardown import arm_teardown_deadline, exit_without_finalizing, failed_teardown_s, release_process_groups

log = logging.getLogger("bench.worker")


def _setup_logging(run_dir: Path, rank: int) -> None:
    handlers: list[logging.Handler] = [logging.FileHandler(run_dir / f"rank{rank}.log")]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format=f"[%(asctime)s][rank{rank}][%(levelname)s] %(message)s")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _record_event() -> torch.cuda.Event:
    """A timing event recorded on the current CUDA stream (no host sync)."""
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def measure_matmul_peak(device: torch.device, n: int = 8192, iters: int = 10) -> float:
    """Achieved bf16 TFLOP/s of an n^3 matmul on this device (a measured MFU denominator)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    _sync(device)
    dt = time.perf_counter() - t0
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 * iters / dt / 1e12


def inject_fault(fault: FaultConfig, rank: int, step: int) -> None:
    """Test hook (config ``fault``): fail like a real run would, on one rank at one step."""
    if fault.kind == "none" or fault.rank != rank or fault.step != step:
        return
    if fault.kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    if fault.kind == "oom":
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected on rank {rank} at step {step})")
    if fault.kind == "hang":
        while True:
            time.sleep(1)


FAILED_EXIT_FAULT = "BENCH_FAULT_FAILED_EXIT"  # test hook: how the rank that an injected raise / oom failed exits


def _failed_exit_fault(fault: FaultConfig, rank: int) -> None:
    """Test hook for the exit of the rank an injected fault failed (environment BENCH_FAULT_FAILED_EXIT):
    ``hang``: its teardown blocks (its own deadline, bench.launch.teardown.failed_teardown_s, ends it);
    ``stuck``: the process cannot end (like the rank whose CUDA graph capture ran out of memory on
    4 H100s: only the launcher ends it)."""
    how = os.environ.get(FAILED_EXIT_FAULT)
    if how not in ("hang", "stuck") or fault.kind not in ("raise", "oom") or fault.rank != rank:
        return
    if how == "stuck":
        faulthandler.cancel_dump_traceback_later()
    inject_fault(replace(fault, kind="hang", step=0), rank, 0)


def _pin_cpus(plan: Plan, local_rank: int) -> list[int]:
    """cpu_affinity=split: this rank (and the threads it starts later: NCCL, NVML, torch's pools) runs on
    its own contiguous share of the CPUs the run may use; returns the CPUs this rank may run on."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if plan.run.cpu_affinity != "split":
        return allowed
    if "SLURM_JOB_ID" in os.environ:  # each task's CPUs are SLURM's to bind; splitting them again would be wrong
        raise RuntimeError("cpu_affinity=split is for runs bench launches itself; under SLURM bind each task "
                           "with SLURM (hydra.launcher.cpus_per_task, srun --cpu-bind) and use cpu_affinity=none")
    local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", plan.world_size))
    share = len(allowed) // local_ws
    if share < 1:
        raise RuntimeError(f"cpu_affinity=split: {len(allowed)} CPU(s) for {local_ws} local ranks; "
                           "use cpu_affinity=none")
    mine = allowed[local_rank * share:(local_rank + 1) * share]
    os.sched_setaffinity(0, mine)
    return mine


def _device(plan: Plan, local_rank: int) -> torch.device:
    if plan.device == "cuda":
        if torch.cuda._is_in_bad_fork():  # the fork server started CUDA (it must not: bench/launch/local.py)
            raise RuntimeError("this rank was forked from a process that had started CUDA, so it cannot use "
                               "CUDA; run with start_method=spawn and report the modules in bench.launch.local._PRELOAD")
        torch.cuda.set_device(local_rank)
        if plan.run.precision == "fp32":  # TF32 for fp32 matmuls only when asked (config tf32)
            torch.backends.cuda.matmul.allow_tf32 = plan.run.tf32
            torch.backends.cudnn.allow_tf32 = plan.run.tf32
        return torch.device("cuda", local_rank)
    # CPU: share the cores between the ranks of this node instead of oversubscribing them
    local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", plan.world_size))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ws))
    return torch.device("cpu")


def _setup(plan: Plan, rank: int, local_rank: int, world_size: int):
    """Process group, device, strategy (set up), and the start-up phases: (ctx, strategy, record)."""
    spec = get_spec(plan.strategy.name)
    # imported before this rank's own code ran: by the fork server (start_method=forkserver)
    preloaded = [m for m in sweep_preloads(plan.run) if m in sys.modules]
    os.environ.update({**spec.process_env(plan), **rank_env(plan.run.allocator)})  # before CUDA starts
    startup: dict[str, float] = {}  # before setup (metrics.json ranks[].startup_phases_s)
    cpus = _pin_cpus(plan, local_rank)  # before any thread of this rank starts
    with phase(startup, "device_and_process_group"):
        device = _device(plan, local_rank)
        dist.init_process_group(plan.backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=plan.run.dist_timeout_s))
        _barrier(device)  # the first collective: NCCL's buffers taken now
    ctx = DistContext(rank=rank, local_rank=local_rank, world_size=world_size, device=device, backend=plan.backend)
    strategy = spec.implementation(plan)(plan, ctx)
    matmul_peak = None
    if device.type == "cuda" and rank == 0 and plan.run.metrics.measure_matmul_peak:
        with phase(startup, "matmul_peak"):
            matmul_peak = measure_matmul_peak(device)
    t = time.perf_counter()
    strategy.setup()
    setup_s = time.perf_counter() - t
    log.info("setup done in %.1f s: %s", setup_s, strategy.describe())
    return ctx, strategy, {"setup_s": setup_s, "startup_phases_s": startup, "preloaded_modules": preloaded,
                           "cpus": cpus, "matmul_peak": matmul_peak}


def _barrier(device: torch.device) -> None:
    """All ranks meet, on this rank's device (named for NCCL: no guess, no warning).  The first is made as soon as the
    group exists: NCCL sets up a communicator's connections and device buffers at its first collective (with
    cudaMalloc, outside PyTorch's allocator), so they are taken before the model and its steps fill the device.  A
    one-rank run's first collective was the barrier after its warm-up: at the limit, with PyTorch's allocator holding
    the rest of the card, it failed (results/2026-12-06-h100x1-tight-edge)."""
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def _warmup(plan: Plan, strategy, rank: int, device, losses: list, skipped: list) -> dict:
    """The untimed first steps (compilation, CUDA graph capture, allocator and NCCL set-up), with Python's garbage
    collected after the first and the last of them (:func:`_collect_garbage`)."""
    run = plan.run
    t0_wall, t0 = time.time(), time.perf_counter()  # t_first_step: bench/launch/job.py's fixed overhead
    freed = []
    for n in range(run.warmup_steps):
        inject_fault(run.fault, rank, n)
        res = strategy.step(n)
        losses.append(res.loss)
        skipped.append(res.skipped)
        if n in (0, run.warmup_steps - 1):
            freed.append(_collect_garbage(device))
    _sync(device)
    return {"t_first_step": t0_wall, "warmup_s": time.perf_counter() - t0,
            "graphs_after_warmup": compile_counts()["graphs"] if run.compile else None,
            "warmup_garbage_freed_mb": sum(freed) if device.type == "cuda" and freed else None}


def _collect_garbage(device) -> float:
    """Device MiB that Python's cyclic garbage collector frees now.  The first (compiling) step can leave a
    micro-batch's full-vocabulary logits in a reference cycle, alive until a full collection: under DeepSpeed with
    torch.compile, 2,004 MiB of Llama 3.2 1B's bf16 logits (micro-batch 4) stayed through the next steps and into
    their allocated peak (1 x H100, results/2026-12-06-h100x1-zero-memory).  Collected here, in the untimed warm-up,
    the measured peak is the steady step's, as the memory plan predicts it."""
    _sync(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    gc.collect()
    return (before - torch.cuda.memory_allocated(device)) / 2**20 if device.type == "cuda" else 0.0


def _timed_window(plan: Plan, strategy, rank: int, device, losses: list, skipped: list) -> dict:
    """Barrier, then every remaining step timed on its own; the NVML sampler runs across the window.

    metrics.step_timing: a torch.cuda.synchronize after every step ("sync") keeps the host from running
    ahead into the next step, so on host-bound steps it serialises host and GPU and understates what a
    real training loop gets; "events" records a CUDA event after each step and synchronizes once, after
    the window.  CPU steps are synchronous: both time each step with perf_counter."""
    run = plan.run
    steps, warmup = run.steps, run.warmup_steps
    use_events = device.type == "cuda" and run.metrics.step_timing == "events"
    source = "host_clock_cpu" if device.type != "cuda" else "cuda_events" if use_events else "host_sync_each_step"
    sampler = NvmlSampler(device.index if device.type == "cuda" else None, run.metrics.nvml_interval_ms)
    _barrier(device)
    sampler.start()
    step_times, events = [], []  # use_events: one before the first timed step, then one after each
    t_window = time.perf_counter()
    if use_events:
        events.append(_record_event())
    for n in range(warmup, steps):
        inject_fault(run.fault, rank, n)
        t0 = time.perf_counter()
        res = strategy.step(n)
        if use_events:
            events.append(_record_event())
        else:
            _sync(device)
            step_times.append(time.perf_counter() - t0)
        losses.append(res.loss)
        skipped.append(res.skipped)
        if rank == 0 and (n + 1 - warmup) % max(1, (steps - warmup) // 4) == 0:
            so_far = time.perf_counter() - t_window
            tps = (n + 1 - warmup) * plan.model.global_batch * plan.model.seq_len / so_far
            log.info("step %d/%d  %.2f s so far  %.0f tokens/s so far (host clock%s)", n + 1, steps, so_far, tps,
                     ", steps enqueued" if use_events else "")
    _sync(device)
    window_s = time.perf_counter() - t_window
    if use_events:
        step_times = [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]
    sampler.stop()
    return {"step_times": step_times, "step_time_source": source, "window_s": window_s, **sampler.summary()}


def train(plan: Plan, run_dir: Path, rank: int, local_rank: int, world_size: int,
          teardown_deadline: bool = False) -> None:
    """One run on this rank: set up, warm up, the timed window, an optional profile, then the records.
    ``teardown_deadline``: end this process if its teardown outlasts teardown_timeout_s."""
    ctx, strategy, start = _setup(plan, rank, local_rank, world_size)
    device = ctx.device
    losses: list = []
    skipped: list[bool] = []
    warm = _warmup(plan, strategy, rank, device, losses, skipped)
    timed = _timed_window(plan, strategy, rank, device, losses, skipped)
    compiled = compile_record(plan.run, rank, warm["graphs_after_warmup"])
    k = plan.run.metrics.profile_steps
    profile = profile_steps(strategy.step, range(plan.run.steps - k, plan.run.steps), device,
                            trace_path=run_dir / f"trace_rank{rank}.json.gz") if k else None
    rec = {
        "rank": rank,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "tokens_per_step": strategy.tokens_this_rank(),
        "losses": [None if l is None else float(l) for l in losses],
        "skipped": skipped,
        **{k: v for k, v in timed.items()},
        "setup_s": start["setup_s"], "startup_phases_s": start["startup_phases_s"],
        "setup_phases_s": strategy.setup_phases_s, "preloaded_modules": start["preloaded_modules"],
        "compile": compiled, "warmup_s": warm["warmup_s"], "warmup_garbage_freed_mb": warm["warmup_garbage_freed_mb"],
        # wall clock, for bench/launch/job.py: launch -> first step, last step (profiled ones included) -> done
        "t_first_step": warm["t_first_step"], "t_loop_end": time.time(),
        "max_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "max_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20 if device.type == "cuda" else None,
        "allocator": allocator_record(device, timed.get("nvml_mem_used_peak_mb")),  # bench/metrics/memory.py
        "host_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cpus": start["cpus"],  # the CPUs this rank's threads may run on (config cpu_affinity)
        "placement": placement(),  # its node, addresses and the master address (bench/machine/placement.py)
        "profile": profile,
    }
    write_json_atomic(run_dir / f"rank{rank}.json", rec)
    if device.type == "cuda":  # cached blocks returned first: at the limit, gathering the records' bytes over NCCL
        torch.cuda.empty_cache()  # failed with "unhandled cuda error" after every step had run (4 x H100, 8B fp8)
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(rec, gathered, dst=0)
    if rank == 0:
        _write_metrics(plan, run_dir, device, gathered, strategy, start["matmul_peak"])
    _barrier(device)
    if teardown_deadline:
        arm_teardown_deadline(run_dir, rank, plan.run.teardown_timeout_s)
    strategy.close()


def _write_metrics(plan: Plan, run_dir: Path, device, gathered: list, strategy, matmul_peak) -> None:
    prov = provenance.collect(plan.command or [], [r["device_name"] for r in gathered])
    layout = {**strategy.describe(), "grad_reduce": grad_reduce_of(plan)}  # what gradient sums are in
    if plan.tuning:
        layout["tuning"] = plan.tuning
    if plan.micro_batch_auto:  # strategy.micro_batch_size=auto: what it chose and why
        layout["micro_batch_size_auto"] = plan.micro_batch_auto
    m = metrics.assemble(plan, device.type, gathered, layout, prov, matmul_peak)
    m["memory"]["plan"] = plan.memory  # predicted before launch (bench/launch/job.py), beside the measured peak
    write_json_atomic(run_dir / "metrics.json", m)
    log.info(metrics.one_line(m))
    log.info(loss_note(plan.model.vocab_size))


@record
def worker_main(plan_dict: dict, run_dir: str, teardown_deadline: bool = False) -> None:
    """Entry point of one rank (started by torch elastic, or directly under SLURM).
    ``teardown_deadline``: see arm_teardown_deadline (the elastic launcher's ranks only: a SLURM
    task records the run's status itself after this returns)."""
    if teardown_deadline:  # this run's own process (not a SLURM task's, which may hold an earlier run's garbage):
        gc.freeze()  # what it started with (torch, the server's imports) leaves its collections and the teardown's walk
    plan = plan_from_dict(plan_dict)
    rank = int(os.environ["RANK"])
    run_path = Path(run_dir)
    _setup_logging(run_path, rank)
    failed = False
    try:
        train(plan, run_path, rank, int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]), teardown_deadline)
        fault = plan.run.fault
        if fault.kind == "crash_at_exit" and fault.rank == rank:
            os._exit(134)  # like a C++ abort during interpreter shutdown: no Python exception
        if fault.kind == "hang_at_exit" and fault.rank == rank:
            inject_fault(replace(fault, kind="hang", step=0), rank, 0)  # like a teardown that never returns
        if fault.kind == "stuck_at_exit":  # every rank: like the graph runs' ranks on 2 H200s that had
            faulthandler.cancel_dump_traceback_later()  # left Python (os._exit) and did not end
            inject_fault(replace(fault, kind="hang", step=0), rank, 0)
    except BaseException as exc:
        failed = True
        write_json_atomic(run_path / f"failure_rank{rank}.json", failure_record(exc, rank))
        log.exception("rank %d failed", rank)
        traceback.clear_frames(exc.__traceback__)  # its frames would keep the model, hence its groups, alive
        if teardown_deadline:  # its own process: the failure is recorded, nothing is left to save
            arm_teardown_deadline(run_path, rank, failed_teardown_s(plan.run))
            exit_without_finalizing(1)
        _failed_exit_fault(plan.run.fault, rank)
        raise
    finally:
        _close_process_group(failed, own_process=teardown_deadline)


def failure_record(exc: BaseException, rank: int) -> dict:
    """failure_rank{r}.json: the error that ended this rank; an out-of-memory error it was raised
    from or while handling is the root cause (type and message), the error raised is ``raised_as``."""
    oom = oom_in_chain(exc)
    root = oom or exc
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    raised = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    return {"rank": rank, "node": placement()["node"], "type": type(root).__name__, "message": str(root),
            "oom": oom is not None, "raised_as": None if root is exc else raised,
            "traceback": traceback.format_exc(), "time": time.time(), "pid": os.getpid(),
            "world_size": int(os.environ.get("WORLD_SIZE", 0)),
            "device_name": torch.cuda.get_device_name() if cuda else None,  # the analysis re-plans a failed run
            "allocator": allocator_record(torch.device("cuda", torch.cuda.current_device()) if cuda else None)}


C10D_THREADS_LEFT = "c10d threads still running after the process groups were released"


def _close_process_group(abort_it: bool, own_process: bool = False) -> None:
    """Destroy the group; after a failure on NCCL, abort it instead: a peer may be blocked in a
    collective this rank will never join, and destroy would wait for it (seen on 2 H200s: the
    failing rank hung until run_timeout_s instead of exiting, so the launcher never saw it fail).
    (After CUDA-graph runs on 2 H200s, aborting instead of destroying left the processes unable to
    end, even after os._exit, until run_timeout_s: the launcher's teardown deadline ends them.)
    Then drop what keeps a destroyed group's C++ object - and its threads - alive (DTensor's device
    meshes, torch.distributed.nn's default arguments, megatron's globals: bench/launch/teardown.py), so that
    no c10d thread is left running while a spawned rank's interpreter finalizes (the random
    "terminate called without an active exception" abort at exit); a rank where some are left all
    the same does not finalize its interpreter, where the process is its own (``own_process``: an
    elastic rank; a SLURM task's process is submitit's, which records the result after this).
    A failed rank whose process is its own releases nothing and ends with os._exit: on 2 H100s,
    aborting the NCCL group of a rank that ran out of memory inside a CUDA graph capture holding an
    all-reduce, while its peer waited in a barrier, never returned (the hang of issue 43 on 4 H100s),
    where os._exit ended the process at once; its teardown deadline (bench/launch/teardown.py) is the net."""
    if abort_it and own_process:
        log.info("this rank failed: it ends with os._exit, its process groups not aborted (bench/launch/worker.py)")
        return
    left = release_process_groups(abort=abort_it)
    if left:  # DeepSpeed's engine keeps its groups: then this rank skips the interpreter's finalization
        log.info("%s: %s%s (bench/launch/teardown.py)", C10D_THREADS_LEFT, ", ".join(left),
                 "; this rank ends with os._exit" if own_process else "")
        if own_process:
            exit_without_finalizing(1 if abort_it else 0)

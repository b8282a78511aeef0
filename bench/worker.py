"""The per-rank loop: the only training loop in bench.

init process group -> strategy.setup() -> warm-up steps -> barrier -> timed steps (timed by
CUDA events or a host sync after each: metrics.step_timing) -> per-rank record -> rank 0
assembles and writes metrics.json.
A rank that raises writes ``failure_rank{r}.json`` (type, message, traceback) before the
exception leaves, so the launcher can tell the root cause from its collateral.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import re
import resource
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from bench import metrics
from bench.config import Plan
from bench.memory_model import predicted_model_state_mb
from bench.metrics import provenance
from bench.metrics.io import write_json_atomic
from bench.metrics.nvml import NvmlSampler
from bench.metrics.profile import profile_steps
from bench.metrics.timing import phase
from bench.strategies.base import DistContext, get_strategy, sweep_preloads
from bench.teardown import exit_without_finalizing, release_process_groups

log = logging.getLogger("bench.worker")


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


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


def compile_counts() -> dict:
    """torch.compile's work in this process so far: graphs built (a recompile builds one more) and
    graph breaks, with the commonest reasons."""
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    return {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(breaks.values()),
            "graph_break_reasons": [r for r, _ in breaks.most_common(3)]}


def inject_fault(fault: dict, rank: int, step: int) -> None:
    """Test hook (config ``fault``): fail like a real run would, on one rank at one step."""
    if fault["kind"] == "none" or fault["rank"] != rank or fault["step"] != step:
        return
    if fault["kind"] == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    if fault["kind"] == "oom":
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected on rank {rank} at step {step})")
    if fault["kind"] == "hang":
        while True:
            time.sleep(1)


def _pin_cpus(plan: Plan, local_rank: int) -> list[int]:
    """cpu_affinity=split: this rank (and the threads it starts later: NCCL, NVML, torch's pools) runs on
    its own contiguous share of the CPUs the run may use; returns the CPUs this rank may run on."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if plan.cfg["cpu_affinity"] != "split":
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
        if torch.cuda._is_in_bad_fork():  # the fork server started CUDA (it must not: bench/launch.py)
            raise RuntimeError("this rank was forked from a process that had started CUDA, so it cannot use "
                               "CUDA; run with start_method=spawn and report the modules in bench.launch._PRELOAD")
        torch.cuda.set_device(local_rank)
        if plan.cfg["precision"] == "fp32":  # TF32 for fp32 matmuls only when asked (config tf32)
            torch.backends.cuda.matmul.allow_tf32 = plan.cfg["tf32"]
            torch.backends.cudnn.allow_tf32 = plan.cfg["tf32"]
        return torch.device("cuda", local_rank)
    # CPU: share the cores between the ranks of this node instead of oversubscribing them
    local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", plan.world_size))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ws))
    return torch.device("cpu")


def train(plan: Plan, run_dir: Path, rank: int, local_rank: int, world_size: int,
          teardown_deadline: bool = False) -> None:
    """One run on this rank.
    ``teardown_deadline``: end this process if its teardown outlasts teardown_timeout_s."""
    cfg = plan.cfg
    strategy_cls = get_strategy(plan.strategy["name"])
    # imported before this rank's own code ran: by the fork server (start_method=forkserver)
    preloaded = [m for m in sweep_preloads(plan.strategy) if m in sys.modules]
    os.environ.update(strategy_cls.process_env(plan))  # before CUDA starts (e.g. CUDA_DEVICE_MAX_CONNECTIONS)
    startup_phases: dict[str, float] = {}  # before setup (metrics.json ranks[].startup_phases_s)
    cpus = _pin_cpus(plan, local_rank)  # before any thread of this rank starts
    with phase(startup_phases, "device_and_process_group"):
        device = _device(plan, local_rank)
        dist.init_process_group(plan.backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=cfg["dist_timeout_s"]))
    ctx = DistContext(rank=rank, local_rank=local_rank, world_size=world_size, device=device,
                      backend=plan.backend)
    strategy = strategy_cls(plan, ctx)

    matmul_peak = None
    if device.type == "cuda" and rank == 0 and cfg["metrics"]["measure_matmul_peak"]:
        with phase(startup_phases, "matmul_peak"):
            matmul_peak = measure_matmul_peak(device)

    t_setup = time.perf_counter()
    strategy.setup()
    setup_s = time.perf_counter() - t_setup
    log.info("setup done in %.1f s: %s", setup_s, strategy.describe())

    steps, warmup = cfg["steps"], cfg["warmup_steps"]
    losses: list = []
    skipped: list[bool] = []
    t_first_step = time.time()  # bench/job.py: fixed overhead (launch -> first step)
    t_warm = time.perf_counter()
    for n in range(warmup):
        inject_fault(cfg["fault"], rank, n)
        res = strategy.step(n)
        losses.append(res.loss)
        skipped.append(res.skipped)
    _sync(device)
    warmup_s = time.perf_counter() - t_warm
    graphs_after_warmup = compile_counts()["graphs"] if cfg["compile"] else None

    # metrics.step_timing: a torch.cuda.synchronize after every step ("sync") keeps the host from
    # running ahead into the next step, so on host-bound steps (launch overhead) it serialises host
    # and GPU and understates what a real training loop gets.  "events" records a CUDA event after
    # each step instead and synchronizes once, after the window.  CPU steps are synchronous: both
    # time each step with perf_counter.
    use_events = device.type == "cuda" and cfg["metrics"]["step_timing"] == "events"
    step_time_source = ("host_clock_cpu" if device.type != "cuda" else
                        "cuda_events" if use_events else "host_sync_each_step")
    sampler = NvmlSampler(device.index if device.type == "cuda" else None, cfg["metrics"]["nvml_interval_ms"])
    dist.barrier()
    sampler.start()
    step_times = []
    events = []  # use_events: one before the first timed step, then one after each
    t_window = time.perf_counter()
    if use_events:
        events.append(_record_event())
    for n in range(warmup, steps):
        inject_fault(cfg["fault"], rank, n)
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
            tps = (n + 1 - warmup) * cfg["model"]["global_batch"] * cfg["model"]["seq_len"] / so_far
            if use_events:  # no sync here: the GPU may still be behind the host
                log.info("step %d/%d  %.2f s so far (host clock, steps enqueued)  %.0f tokens/s so far (host clock)",
                         n + 1, steps, so_far, tps)
            else:
                log.info("step %d/%d  %.1f ms  %.0f tokens/s so far", n + 1, steps, 1e3 * step_times[-1], tps)
    _sync(device)
    window_s = time.perf_counter() - t_window
    if use_events:
        step_times = [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]
    compiled = None
    if cfg["compile"]:  # graphs compiled inside the timed window mean it timed compilation too
        compiled = {**compile_counts(), "graphs_after_warmup": graphs_after_warmup}
        if compiled["graphs"] > graphs_after_warmup:
            log.warning("rank %d: torch.compile built %d graph(s) during the timed window (recompiles); "
                        "raise warmup_steps", rank, compiled["graphs"] - graphs_after_warmup)
    sampler.stop()
    profile = None
    k = cfg["metrics"]["profile_steps"]
    if k:  # after the timed window: profiling never slows a timed step
        profile = profile_steps(strategy.step, range(steps - k, steps), device)
    t_loop_end = time.time()  # bench/job.py: fixed overhead (last step, profiled ones included -> done)

    rec = {
        "rank": rank,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "tokens_per_step": strategy.tokens_this_rank(),
        "losses": [None if l is None else float(l) for l in losses],
        "skipped": skipped,
        "step_times": step_times,
        "step_time_source": step_time_source,  # cuda_events | host_sync_each_step | host_clock_cpu
        "window_s": window_s,
        "setup_s": setup_s,
        "startup_phases_s": startup_phases,
        "setup_phases_s": strategy.setup_phases_s,
        "preloaded_modules": preloaded,
        "compile": compiled,
        "warmup_s": warmup_s,
        "t_first_step": t_first_step, "t_loop_end": t_loop_end,  # wall clock, for bench/job.py
        "max_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "max_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20 if device.type == "cuda" else None,
        "host_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cpus": cpus,  # the CPUs this rank's threads may run on (config cpu_affinity)
        "profile": profile,
        **sampler.summary(),
    }
    write_json_atomic(run_dir / f"rank{rank}.json", rec)
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(rec, gathered, dst=0)
    if rank == 0:
        prov = provenance.collect(cfg.get("_command", []), [r["device_name"] for r in gathered])
        m = metrics.assemble(cfg, device.type, gathered, strategy.describe(), prov, matmul_peak)
        m["memory"]["predicted_model_state_mb"] = predicted_model_state_mb(plan)
        write_json_atomic(run_dir / "metrics.json", m)
        log.info(metrics.one_line(m))
    dist.barrier()
    if teardown_deadline:
        arm_teardown_deadline(run_dir, rank, cfg["teardown_timeout_s"])
    strategy.close()


TEARDOWN_TIMEOUT_HEADER = re.compile(r"^Timeout \(\d+:\d\d:\d\d(\.\d+)?\)!$", re.M)  # faulthandler's dump


def arm_teardown_deadline(run_dir: Path, rank: int, seconds: int) -> None:
    """The results are written; what is left is teardown, which has hung on 2 H200s after NCCL
    collectives captured in CUDA graphs, holding the run until run_timeout_s.  faulthandler's own C
    thread (it needs no GIL, so it fires even inside a blocked NCCL or CUDA call, or during the
    process's exit) appends every thread's Python stack to this rank's log after ``seconds`` and
    ends the process with exit code 1; the launcher keeps the result (TEARDOWN_TIMEOUT_HEADER)."""
    log_file = open(run_dir / f"rank{rank}.log", "a")  # kept open: faulthandler writes to its fd
    faulthandler.dump_traceback_later(seconds, exit=True, file=log_file)
    _keep_open.append(log_file)


_keep_open: list = []  # the files arm_teardown_deadline gave faulthandler


@record
def worker_main(plan_dict: dict, run_dir: str, teardown_deadline: bool = False) -> None:
    """Entry point of one rank (started by torch elastic, or directly under SLURM).
    ``teardown_deadline``: see arm_teardown_deadline (the elastic launcher's ranks only: a SLURM
    task records the run's status itself after this returns)."""
    plan = Plan.from_dict(plan_dict)
    rank = int(os.environ["RANK"])
    run_path = Path(run_dir)
    _setup_logging(run_path, rank)
    failed = False
    try:
        train(plan, run_path, rank, int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]), teardown_deadline)
        fault = plan.cfg["fault"]
        if fault["kind"] == "crash_at_exit" and fault["rank"] == rank:
            os._exit(134)  # like a C++ abort during interpreter shutdown: no Python exception
        if fault["kind"] == "hang_at_exit" and fault["rank"] == rank:
            inject_fault({**fault, "kind": "hang", "step": 0}, rank, 0)  # like a teardown that never returns
        if fault["kind"] == "stuck_at_exit":  # every rank: like the graph runs' ranks on 2 H200s that had
            faulthandler.cancel_dump_traceback_later()  # left Python (os._exit) and did not end
            inject_fault({**fault, "kind": "hang", "step": 0}, rank, 0)
    except BaseException as exc:
        failed = True
        write_json_atomic(run_path / f"failure_rank{rank}.json", {
            "rank": rank, "type": type(exc).__name__, "message": str(exc), "oom": is_oom(exc),
            "traceback": traceback.format_exc(), "time": time.time()})
        log.exception("rank %d failed", rank)
        traceback.clear_frames(exc.__traceback__)  # its frames would keep the model, hence its groups, alive
        raise
    finally:
        _close_process_group(failed, own_process=teardown_deadline)


C10D_THREADS_LEFT = "c10d threads still running after the process groups were released"


def _close_process_group(abort_it: bool, own_process: bool = False) -> None:
    """Destroy the group; after a failure on NCCL, abort it instead: a peer may be blocked in a
    collective this rank will never join, and destroy would wait for it (seen on 2 H200s: the
    failing rank hung until run_timeout_s instead of exiting, so the launcher never saw it fail).
    (After CUDA-graph runs on 2 H200s, aborting instead of destroying left the processes unable to
    end, even after os._exit, until run_timeout_s: the launcher's teardown deadline ends them.)
    Then drop what keeps a destroyed group's C++ object - and its threads - alive (DTensor's device
    meshes, torch.distributed.nn's default arguments, megatron's globals: bench/teardown.py), so that
    no c10d thread is left running while a spawned rank's interpreter finalizes (the random
    "terminate called without an active exception" abort at exit); a rank where some are left all
    the same does not finalize its interpreter, where the process is its own (``own_process``: an
    elastic rank; a SLURM task's process is submitit's, which records the result after this)."""
    left = release_process_groups(abort=abort_it)
    if left:  # DeepSpeed's engine keeps its groups: then this rank skips the interpreter's finalization
        log.info("%s: %s%s (bench/teardown.py)", C10D_THREADS_LEFT, ", ".join(left),
                 "; this rank ends with os._exit" if own_process else "")
        if own_process:
            exit_without_finalizing(1 if abort_it else 0)

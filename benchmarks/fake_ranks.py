"""Rank 0 of an N-rank layout on one device, with its collectives faked: torch's fake process group returns from
every collective at once and moves nothing, so the step runs every kernel and every host call of the real layout's
rank 0 (its shards, its DTensor and float8 work, its memory) except the communication.  Why: torch TP=2 in float8
is 19-23% slower than predicted on NVLink and with peer-to-peer off alike, where bf16 TP=2 is within 3%
(docs/results.md, "What remains"); this splits such a gap, on one GPU, into the rank's own work and what the links
add.

    python benchmarks/fake_ranks.py OUT.json WORLD override ...   # e.g. 4 model=llama3_1b strategy=fsdp strategy.tp=2
    FAKE_WARM=2 FAKE_STEPS=3 python benchmarks/fake_ranks.py ...  # fewer warm-up and timed steps (default 3, 6)

Writes and prints: the timed steps (CUDA events, after the warm-up), the peak memory, one profiled step's kernel ms
by kind (bench/metrics/profile.py), the host's own work in a step and where it syncs, and beside them the
prediction with the communication left out (the shipped calibration, bench/plan/predict.py ``compute_parts`` and
``combine`` with every link term zeroed), the predicted host work (``host_time``) and the whole prediction.  Run with
bench's torch-native strategies (FSDP2, torch TP / CP); not DDP, whose reducer needs each all-reduce's result (the
fake group returns none), nor Megatron's, which set their environment before CUDA starts.  On CPU it runs too (a
smoke test: the kernels read 0).  Losses are meaningless: gathered tensors hold whatever memory they were given.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist

from benchmarks.zero_copies import build

CUDA = torch.cuda.is_available()


def prediction(plan) -> dict | None:
    """The step's parts as predicted with and without communication, in ms (shipped calibration); None without
    hardware to predict for (CPU, no ``hardware=`` preset)."""
    from bench.costs.traffic import BYTE_KINDS
    from bench.plan.predict import combine, compute_parts, host_time, load_calibration, terms
    from benchmarks.term_check import kinds_ms

    k = load_calibration()["constants"]
    try:
        t = terms(plan)
    except ValueError:
        return None
    # every byte kind's seconds and the collectives' latencies: the step's time on its links
    alone = {**t, **{f"{kind}_s": 0.0 for kind in BYTE_KINDS}, "collectives": 0.0}
    return {"step_ms": 1e3 * float(combine(t, k)["step_time_s"]),
            "step_without_links_ms": 1e3 * float(combine(alone, k)["step_time_s"]),
            "kernel_ms": kinds_ms(compute_parts(t, k)), "host_ms": 1e3 * float(host_time(t, k))}


def timed(strategy, first: int, n: int) -> tuple[list[float], list[float]]:
    """Seconds of steps first .. first + n - 1: each between two CUDA events (the host runs ahead, as in bench), and
    on the host clock from one step's return to the next's (the host's own time where the device keeps up)."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if CUDA else []
    if CUDA:
        torch.cuda.synchronize()
        events[0].record()
    host = [time.perf_counter()]
    for i in range(n):
        strategy.step(first + i)
        if CUDA:
            events[i + 1].record()
        host.append(time.perf_counter())
    if CUDA:
        torch.cuda.synchronize()
    host_s = [b - a for a, b in zip(host, host[1:])]
    return ([a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])] if CUDA else host_s), host_s


def syncs_in_step(strategy, n: int) -> list[str]:
    """Host-device synchronizations in step n: CUDA's sync debug mode warns at each (a .item(), a copy to the host,
    a synchronize): where the host waits for the device, host and device time add instead of overlapping.  Each as
    the Python line that made it."""
    if not CUDA:
        return []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            strategy.step(n)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]


def host_work(strategy, first: int, n: int) -> list[float]:
    """Seconds of the host's own work in steps first .. first + n - 1: each from a synchronized device to the step's
    return.  The device starts idle, so the host waits on it only where the step syncs on work it has launched
    (``syncs_in_step`` says where): where that is early, the return is the host's time to launch the step, and a
    step whose host work is longer than its GPU time is host-bound."""
    out = []
    for i in range(n):
        if CUDA:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        strategy.step(first + i)
        out.append(time.perf_counter() - t0)
    if CUDA:
        torch.cuda.synchronize()
    return out


def host_ops(strategy, n: int, top: int = 25) -> list[dict]:
    """Step n's host operators by their total CPU time (torch.profiler, CPU only): where the host's time goes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        strategy.step(n)
    rows = sorted(prof.key_averages(), key=lambda e: -e.cpu_time_total)[:top]
    return [{"name": e.key[:90], "calls": e.count, "total_ms": e.cpu_time_total / 1e3,
             "self_ms": e.self_cpu_time_total / 1e3} for e in rows]


def main(out: str, world: int, overrides: list[str], warm: int = 3, steps: int = 6) -> dict:
    """Build, warm up, time ``steps`` steps, then one step each for the syncs, the kernels and the host's operators."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from bench.metrics.profile import profile_steps

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", RANK="0", WORLD_SIZE=str(world), LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE=str(world))
    device = torch.device("cuda", 0) if CUDA else torch.device("cpu")
    if CUDA:
        torch.cuda.set_device(device)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    run = [f"world_size={world}", f"device={device.type}", f"steps={warm + steps + 6}", f"warmup_steps={warm}"]
    plan, st, _ = build(list(overrides) + run, 0, world, device, gpus=world)
    for i in range(warm):
        st.step(i)
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    secs, host_s = timed(st, warm, steps)
    syncs = syncs_in_step(st, warm + steps)
    own = host_work(st, warm + steps + 3, 3)
    prof = profile_steps(st.step, [warm + steps + 1], device)
    ops = host_ops(st, warm + steps + 2)
    rec = {"overrides": list(overrides), "world_size": world, "layout": st.describe(),
           "device": torch.cuda.get_device_name(0) if CUDA else "cpu", "torch": torch.__version__,
           "step_s": secs, "step_ms_median": 1e3 * statistics.median(secs), "host_s": host_s,
           "host_ms_median": 1e3 * statistics.median(host_s), "syncs_per_step": len(syncs), "syncs_at": syncs,
           "host_work_s": own, "host_work_ms_median": 1e3 * statistics.median(own),
           "host_ops": ops,
           "max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if CUDA else None,
           "kernel_ms": dict(prof.get("kernel_ms_per_step") or {}),
           "gpu_busy_ms": prof.get("gpu_busy_ms_per_step"), "predicted": prediction(plan)}
    with open(out, "w") as f:
        json.dump(rec, f, indent=1, default=str)
    p = rec["predicted"] or {}
    print(f"{' '.join(overrides)} world {world}: step {rec['step_ms_median']:.1f} ms measured, "
          f"{p.get('step_without_links_ms', float('nan')):.1f} predicted without links "
          f"({p.get('step_ms', float('nan')):.1f} with); host clock {rec['host_ms_median']:.1f} ms; {len(syncs)} syncs; "
          f"GPU busy {rec['gpu_busy_ms'] or 0:.1f} ms; peak {rec['max_allocated_gib'] or 0:.1f} GiB")
    print(f"  the host's own work {rec['host_work_ms_median']:.1f} ms a step from an idle device (predicted "
          f"{p.get('host_ms', float('nan')):.1f}); syncs at {syncs}")
    for kind in ("matmul", "attention", "other", "optimizer", "communication"):
        print(f"  {kind:10s} kernels {rec['kernel_ms'].get(kind, 0.0):8.1f} ms   predicted "
              f"{(p.get('kernel_ms') or {}).get(kind, float('nan')):8.1f}")
    for op in ops[:12]:
        print(f"  host {op['total_ms']:7.1f} ms total {op['self_ms']:6.1f} self {op['calls']:5d} x {op['name']}")
    st.close()
    dist.destroy_process_group()
    return rec


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:], int(os.environ.get("FAKE_WARM", 3)),
         int(os.environ.get("FAKE_STEPS", 6)))

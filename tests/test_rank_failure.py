"""A rank that runs out of memory while its peers wait in a collective ends its run in seconds (gloo, real
processes, ``python -m bench``).

On 4 H100s a rank ran out of memory inside Megatron's CUDA graph capture, recorded it, and then never
exited; its peers waited for it in a collective and the run was recorded ``timeout`` at run_timeout_s.
Here the failing rank's exit is made to block the same way (bench.launch.worker's test hook
BENCH_FAULT_FAILED_EXIT): ``hang``, a teardown that blocks (the rank's own deadline ends it), or
``stuck``, a process that cannot end (only the launcher can end the run).  run_timeout_s is 600: a run
that ends at all within the test's bound ended on the failure, not on the timeout.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from bench.launch.teardown import TEARDOWN_TIMEOUT_HEADER
from tests.conftest import REPO, fault_env, metrics_of, processes_left, record_fault

RUN_TIMEOUT_S = 600
BOUND_S = 300  # the command must return by then: far below RUN_TIMEOUT_S, far above a loaded machine's start-up


def _bench(args: list[str], env: dict) -> subprocess.CompletedProcess:
    """``python -m bench args``; past BOUND_S the test fails, and ends what the command left running."""
    try:
        return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=BOUND_S, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
    except subprocess.TimeoutExpired:
        for line in processes_left(env, wait_s=0):
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise


@pytest.mark.slow
@pytest.mark.parametrize("world,rank,step,exit_how", [
    (4, 2, 2, "hang"),   # in the timed window, its peers in DDP's gradient all-reduce
    (2, 0, 0, "stuck"),  # the first (warm-up) step, as a capture failure; rank 0 hosts the rendezvous store
])
def test_oom_of_one_rank_ends_the_run_with_its_status(tmp_path, world, rank, step, exit_how):
    """status oom (not timeout), the error names the failing rank and its message, no process is left,
    and the run ended long before run_timeout_s."""
    d, env = tmp_path / "run", {**fault_env(), "BENCH_FAULT_FAILED_EXIT": exit_how}
    args = ["device=cpu", "precision=fp32", "strategy=ddp", f"world_size={world}", "steps=40", "warmup_steps=1",
            "fault.kind=oom", f"fault.rank={rank}", f"fault.step={step}", "teardown_timeout_s=2",
            f"run_timeout_s={RUN_TIMEOUT_S}", f"hydra.run.dir={d}"]
    p = _bench(args, env)
    left = processes_left(env)
    m = metrics_of(d)
    record_fault(f"oom of rank {rank} of {world}, its exit {exit_how} (ddp)", m["status"],
                 0 if m["status"] == "oom" else 1, len(left), m["error"]["message"])
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert m["status"] == "oom", (m["error"], out[-3000:])
    assert m["error"]["rank"] == rank and m["error"]["type"] == "OutOfMemoryError", m["error"]
    assert m["error"]["message"] == f"CUDA out of memory (injected on rank {rank} at step {step})"
    assert json.loads((d / "status.json").read_text())["status"] == "oom"
    assert not left, left
    if exit_how == "hang":  # its own teardown deadline ended it (faulthandler's stacks in its log)
        assert TEARDOWN_TIMEOUT_HEADER.search((d / f"rank{rank}.log").read_text()), out[-3000:]
        assert "has not ended" not in out
    else:  # the process could not end: the launcher ended the run
        assert "has not ended" in out, out[-3000:]


def test_oom_raised_from_a_failed_capture_or_in_nccl_is_recorded_as_the_oom():
    """The error a CUDA graph capture raises after running out of memory (AcceleratorError at capture_end,
    raised while handling the OutOfMemoryError) is recorded as the out-of-memory error it came from; NCCL's failed
    device allocation is an out-of-memory error."""
    import torch

    from bench.launch.worker import failure_record

    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.25 GiB")
        finally:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as e:
        rec = failure_record(e, 3)
    assert rec["oom"] is True and rec["rank"] == 3 and rec["type"] == "OutOfMemoryError"
    assert rec["message"] == "CUDA out of memory. Tried to allocate 3.25 GiB"
    assert rec["raised_as"] == "RuntimeError: CUDA error: operation failed due to a previous error during capture"
    assert "Tried to allocate" in rec["traceback"] and "previous error during capture" in rec["traceback"]
    # NCCL's own allocation on a full device, as a one-rank run's barrier after its warm-up raised it at the limit
    # (1 x H100, results/2026-12-06-h100x1-tight-edge): out of memory, not a failure of the run's code
    nccl = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, unhandled cuda error (run with "
            "NCCL_DEBUG=INFO for details), NCCL version 2.28.9\nncclUnhandledCudaError: Call to CUDA function failed."
            "\nLast error:\nFailed to CUDA calloc async 4 bytes")
    try:
        raise torch.distributed.DistBackendError(nccl)
    except RuntimeError as e:
        rec = failure_record(e, 0)
    assert rec["oom"] is True and rec["type"] == "DistBackendError" and rec["raised_as"] is None
    try:
        raise torch.distributed.DistBackendError(nccl.replace("Failed to CUDA calloc async 4 bytes", "peer exited"))
    except RuntimeError as e:
        assert failure_record(e, 0)["oom"] is False
    try:
        raise RuntimeError("injected fault")
    except RuntimeError as e:
        plain = failure_record(e, 0)
    assert plain["oom"] is False and plain["type"] == "RuntimeError" and plain["raised_as"] is None


@pytest.mark.slow
def test_oom_of_a_rank_that_cannot_end_ends_a_slurm_task_run(tmp_path):
    """The SLURM code path (hydra/launcher=local_tasks: one submitit task per rank, no elastic agent): rank 0
    runs out of memory in its first step and cannot end; its watchdog records oom and ends it."""
    sweep, env = tmp_path / "multirun", {**fault_env(), "BENCH_FAULT_FAILED_EXIT": "stuck"}
    args = ["--multirun", "hydra/launcher=local_tasks", "device=cpu", "precision=fp32", "strategy=ddp", "world_size=2",
            "steps=40", "warmup_steps=1", "fault.kind=oom", "fault.rank=0", "fault.step=0", "teardown_timeout_s=2",
            f"run_timeout_s={RUN_TIMEOUT_S}", f"hydra.sweep.dir={sweep}"]
    p = _bench(args, env)
    left = processes_left(env)
    m = metrics_of(sweep / "0")
    record_fault("oom of rank 0 of 2 that cannot end (SLURM task path)", m["status"],
                 0 if m["status"] == "oom" else 1, len(left), m["error"]["message"])
    out = p.stdout + p.stderr
    assert m["status"] == "oom", (m["error"], out[-3000:])
    assert m["error"]["rank"] == 0 and m["error"]["message"] == "CUDA out of memory (injected on rank 0 at step 0)"
    assert "its teardown did not end within 2 s" in (sweep / "0" / "rank0.log").read_text()
    assert not left, left

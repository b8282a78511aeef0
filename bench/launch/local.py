"""This process starts every rank of a run: torch's elastic launch (bench/launch/__init__.py)."""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Optional

from bench.jsonio import read_json_dict, write_json_atomic
from bench.launch.outcome import Outcome, from_failures, timeout_error
from bench.run.runs import read_failures
from bench.spec.schema import BenchConfig, Plan
from bench.launch.teardown import failed_teardown_s

log = logging.getLogger("bench.launch")

# What the fork server (start_method=forkserver) imports before it forks any rank: bench's worker
# (torch with it), and, in a sweep of more than one run (bench/sweep/jobs.py calls preload()), the
# modules every run's ranks would import again (bench.strategies.base.sweep_preloads).  A one-off
# run gains nothing from them: its ranks import them side by side, while the server would import
# them before forking.
_PRELOAD: list[str] = ["bench.launch.worker"]



def _shutdown_timeout() -> dict:
    """The agent's SIGTERM-to-SIGKILL wait, where this torch's LaunchConfig has the field (torch 2.11 has not:
    its agent then waits its own 30 s)."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    return ({"shutdown_timeout": SHUTDOWN_TIMEOUT_S}
            if "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)} else {})

def preload(modules) -> None:
    """Add modules for the fork server to import.  It imports the list once, when it starts (the
    first run of this process), so a sweep declares the union over its runs before the first."""
    _PRELOAD.extend(m for m in modules if m not in _PRELOAD)


_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# The launcher ends a completed run's processes this long after each rank's own teardown deadline
# (bench/launch/worker.py: faulthandler, which also dumps the rank's Python stacks) should have fired: for
# a process that has left Python and still does not end.
TEARDOWN_GRACE_S = 10
# A rank recorded its failure (failure_rank<r>.json) and its process is still there this long after its
# own teardown deadline (bench/launch/teardown.py failed_teardown_s) should have ended it: it cannot end (after
# an out-of-memory inside a CUDA graph capture on 4 H100s it never did, while its peers waited for it in
# a collective), and the agent ends the others only once it has.  The launcher ends the run.
FAILURE_GRACE_S = 3
# how long the agent waits for a rank to end after its SIGTERM, then after its SIGKILL (torch's default: 30)
SHUTDOWN_TIMEOUT_S = 10


def launch_local(plan: Plan, run_dir: Path) -> Outcome:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the deadlines (read here: a config without them fails before anything starts)
    deadlines = (plan.run.run_timeout_s, plan.run.teardown_timeout_s + TEARDOWN_GRACE_S,
                 failed_teardown_s(plan.run) + FAILURE_GRACE_S)
    expired: dict = {}  # what ended the run from outside: {"limit": "run_timeout_s" | "teardown_timeout_s" |
    #                     "rank_failure", "at": when}
    stop_watch = threading.Event()
    start_method = plan.run.start_method
    _prepare_start_method(start_method)
    saved = {s: signal.getsignal(s) for s in _HANDLED_SIGNALS}
    with tempfile.TemporaryDirectory(prefix="bench_elastic_") as logs:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=plan.world_size,
            run_id=f"bench-{uuid.uuid4().hex[:8]}",
            rdzv_backend="c10d", rdzv_endpoint="localhost:0",  # port 0: the OS picks a free one
            max_restarts=0, monitor_interval=0.2, start_method=start_method, **_shutdown_timeout(),
            logs_specs=DefaultLogsSpecs(log_dir=logs))
        watcher = threading.Thread(target=_watch_deadlines, args=(run_dir, plan.run, *deadlines, expired, stop_watch),
                                   name="bench-run-deadlines", daemon=True)
        try:
            watcher.start()
            elastic_launch(config, regime_worker)(plan.to_dict(), str(run_dir), True)  # teardown_deadline
            return Outcome("completed")
        except ChildFailedError as e:
            return _outcome_of_failed_child(e, run_dir, plan.run, expired)
        except SignalException as e:
            return _outcome_of_signal(e, run_dir, plan.run, expired)
        finally:
            stop_watch.set()
            for s, h in saved.items():
                signal.signal(s, h)


def regime_worker(plan: dict, run_dir: str, *args):
    """A rank: the run's link regime and NCCL's log file put into its environment (bench/machine/link_regime.py), then
    bench's worker.  Here, in the rank: a fork server started before this run has an older environment."""
    from bench.machine.link_regime import apply
    from bench.launch.worker import worker_main
    from bench.run.config import plan_from_dict

    rank_plan = plan_from_dict(plan)
    apply(rank_plan.run.link_regime, run_dir, os.environ.get("RANK", "0"), rank_plan.backend == "nccl")
    return worker_main(plan, run_dir, *args)


def _watch_deadlines(run_dir: Path, run: BenchConfig, timeout_s, teardown_s: float, failed_s: float, expired: dict,
                     stop_watch: threading.Event) -> None:
    """run_timeout_s from the start; teardown_timeout_s (+ grace) from the moment rank 0's
    completed metrics.json appears; failed_teardown_s (+ grace) from the moment a rank's failure record
    appears, if that rank's process is still there then.
    Each sends this process SIGTERM, which the elastic agent turns into a shutdown of all workers
    (SIGTERM, then SIGKILL); ``expired`` says which limit (``limit``) and when (``at``, wall clock)."""
    t0, started, done_at, failed_at = time.monotonic(), time.time(), None, None
    metrics = run_dir / "metrics.json"
    while not stop_watch.wait(0.5):
        now = time.monotonic()
        if (done_at is None and metrics.is_file() and metrics.stat().st_mtime >= started
                and _completed_before_exit(run_dir)):  # this launch's result, not an older one
            done_at = now
        if failed_at is None and _failed_ranks_alive(run_dir, started):
            failed_at = now
        if timeout_s and now - t0 > timeout_s:
            expired["limit"] = "run_timeout_s"
            log.error("run exceeded run_timeout_s=%s: terminating its processes", timeout_s)
        elif done_at is not None and now - done_at > teardown_s:
            expired["limit"] = "teardown_timeout_s"
            log.error("the processes did not exit within teardown_timeout_s=%s after the run completed: "
                      "terminating them", run.teardown_timeout_s)
        elif failed_at is not None and now - failed_at > failed_s and _failed_ranks_alive(run_dir, started):
            expired["limit"] = "rank_failure"
            log.error("a rank failed %.0f s ago and has not ended (a process that cannot exit, while its peers wait "
                      "for it in a collective): terminating the run's processes", failed_s)
        else:
            continue
        expired["at"] = time.time()
        os.kill(os.getpid(), signal.SIGTERM)
        return


def _failed_ranks_alive(run_dir: Path, since: float) -> list[int]:
    """The ranks of this launch (not an older one) that recorded a failure and whose process is still
    there (one that has ended is the agent's to act on: it ends the others)."""
    alive = []
    for p in run_dir.glob("failure_rank*.json"):
        try:
            fresh = p.stat().st_mtime >= since
        except OSError:  # replaced meanwhile
            continue
        f = read_json_dict(p) if fresh else None
        if f and isinstance(f.get("pid"), int) and _running(f["pid"]):
            alive.append(f.get("rank"))
    return alive


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has: Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _prepare_start_method(start_method: str) -> None:
    if start_method == "forkserver":
        # ranks fork from a server process that has imported torch and bench.launch.worker (and, in a
        # sweep, _PRELOAD's other modules) once (a sweep's later runs reuse it) instead of each rank
        # re-importing them after a spawn; the server never touches CUDA, so each rank initializes
        # CUDA itself as after a spawn.  With triton installed, importing torch._inductor or
        # megatron.core calls torch.cuda.is_available(), whose default check (cudaGetDeviceCount)
        # marks every later fork as unable to use CUDA; the NVML-based check does not, so the server
        # (which inherits this environment when it starts) and the ranks use that one.
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        multiprocessing.set_forkserver_preload(list(_PRELOAD))


def _outcome_of_failed_child(e, run_dir: Path, run: BenchConfig, expired: dict) -> Outcome:
    """The outcome of a launch that ended in torch's ChildFailedError ``e``."""
    failures = read_failures(run_dir)
    killed = _killed_without_record(e, failures)
    # a rank killed from outside is the root cause, also when a peer's record of what that did to it (gloo's
    # "connection closed") then ended the run as a failed rank that did not end; the run or teardown limits
    # kill ranks themselves, so there a rank without a record is no cause
    if killed is not None and expired.get("limit") in (None, "rank_failure") and not _completed_before_exit(run_dir):
        return Outcome("failed", killed, failures)
    if expired:
        return _ended_by_limit(run_dir, expired, run, failures)
    if failures:
        return from_failures(failures)
    rank, pf = e.get_first_failure()
    if _completed_before_exit(run_dir):
        # every rank finished and rank 0 wrote the results after the final barrier; a
        # process died on its way out (DeepSpeed's rare "terminate called without an
        # active exception") or its teardown hung and was ended: keep the measurement,
        # record the exit.
        _add_exit_warning(run_dir, _exit_after_completion(run_dir, rank, pf.exitcode, run))
        return Outcome("completed")
    return Outcome("failed", {"rank": rank, "type": "ChildFailedError",
                              "message": f"rank {rank} exited with code {pf.exitcode}",
                              "traceback": str(e)}, failures)


def _outcome_of_signal(e, run_dir: Path, run: BenchConfig, expired: dict) -> Outcome:
    """The outcome of a launch that a signal (torch's SignalException ``e``) ended."""
    failures = read_failures(run_dir)
    if expired:
        return _ended_by_limit(run_dir, expired, run, failures)
    if _completed_before_exit(run_dir):
        _add_exit_warning(run_dir, f"interrupted ({e}) during the teardown, after the run completed")
        return Outcome("completed")
    return Outcome("interrupted", {"rank": None, "type": "SignalException", "message": str(e),
                                   "traceback": None}, failures)


def _killed_without_record(e, failures: list[dict]) -> Optional[dict]:
    """The error of a rank that a signal ended before it could record anything (kill -9, the kernel's
    out-of-memory killer), or None.  Such a rank is the root cause: its peers' own records (gloo's
    "Connection reset by peer", NCCL's watchdog) are what its death did to them.  (The agent's own
    SIGTERM to the surviving ranks comes after the failure it reports and is not in e.failures.)"""
    recorded = {f.get("rank") for f in failures}
    killed = sorted((rank, pf) for rank, pf in e.failures.items() if pf.exitcode < 0 and rank not in recorded)
    if not killed:
        return _lost_peer(failures)
    rank, pf = killed[0]
    return {"rank": rank, "type": "KilledBySignal",
            "message": f"rank {rank} was killed by signal {-pf.exitcode} ({pf.signal_name()}) without recording an "
                       "error (ended from outside: kill, the kernel's out-of-memory killer)",
            "traceback": None}


# what a rank's communication library says when a peer's process is gone (gloo, NCCL)
PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote process exited")


def _lost_peer(failures: list[dict]) -> Optional[dict]:
    """The rank a peer lost, when every recorded failure is only that (a peer's process gone) and the rank
    named by those records left none: it was ended from outside.  (The launcher reports one dead rank per
    poll, the lowest-numbered, so a recorded peer that exited at once can hide the rank killed before it.)"""
    if not failures or not all(any(p in str(f.get("message", "")).lower() for p in PEER_LOST) for f in failures):
        return None
    world = max(int(f.get("world_size") or 0) for f in failures) or None
    recorded = {f.get("rank") for f in failures}
    silent = [r for r in range(world or 0) if r not in recorded]
    if len(silent) != 1:
        return None
    return {"rank": silent[0], "type": "KilledBySignal",
            "message": f"rank {silent[0]} ended without recording an error while its peers lost their connection to "
                       "it (ended from outside: kill, the kernel's out-of-memory killer)", "traceback": None}


def _completed_before_exit(run_dir: Path) -> bool:
    return (read_json_dict(run_dir / "metrics.json") or {}).get("status") == "completed"


def _exit_after_completion(run_dir: Path, rank: int, exitcode: int, run: BenchConfig) -> str:
    from bench.launch.teardown import TEARDOWN_TIMEOUT_HEADER

    ended = sorted(int(p.stem[4:]) for p in run_dir.glob("rank*.log")
                   if TEARDOWN_TIMEOUT_HEADER.search(p.read_text(errors="replace")[-200_000:]))
    if ended:  # a rank waits for its peers in teardown too, so every rank may have been ended
        return (f"the teardown did not finish within teardown_timeout_s={run.teardown_timeout_s} after the run "
                f"completed; rank(s) {', '.join(map(str, ended))} were ended, their threads' Python stacks are at "
                "the end of their rank<N>.log")
    return f"rank {rank} exited with code {exitcode} after the run completed"


def _add_exit_warning(run_dir: Path, message: str) -> None:
    m = read_json_dict(run_dir / "metrics.json")
    m["exit_warning"] = message
    write_json_atomic(run_dir / "metrics.json", m)
    log.warning("%s; the results were already written and are kept", message)


def _ended_by_limit(run_dir: Path, expired: dict, run: BenchConfig, failures: list) -> Outcome:
    """A run ended by run_timeout_s, teardown_timeout_s or a failed rank that did not end.  If rank 0
    had already written the results after the final barrier, only the exit hung (seen with NCCL
    collectives in CUDA graphs, on 2 H200s, also after the ranks had called os._exit): keep the
    measurement.  A failure a rank recorded before the limit expired is the root cause (an
    out-of-memory stays ``oom``), not the limit that ended what it left behind."""
    limit = expired["limit"]
    if _completed_before_exit(run_dir):
        limits = {"run_timeout_s": run.run_timeout_s, "teardown_timeout_s": run.teardown_timeout_s}
        what = f"{limit}={limits[limit]}" if limit in limits else "a few seconds of a rank's failure"
        _add_exit_warning(run_dir, f"the processes did not exit within {what} after the run completed and were "
                                   "terminated")
        return Outcome("completed")
    if any(f.get("time", 0) <= expired.get("at", float("inf")) for f in failures):
        return from_failures(failures)  # the earliest first
    if limit == "rank_failure":  # its record was there, and is unreadable now
        return Outcome("failed", {"rank": None, "type": "RankFailure", "traceback": None, "message":
                                  "a rank recorded a failure and did not end; its record could not be read"})
    return Outcome("timeout", timeout_error(run.run_timeout_s), failures)

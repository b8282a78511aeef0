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
from bench.runs import read_failures
from bench.schema import Plan

log = logging.getLogger("bench.launch")

# What the fork server (start_method=forkserver) imports before it forks any rank: bench's worker
# (torch with it), and, in a sweep of more than one run (bench/sweep/jobs.py calls preload()), the
# modules every run's ranks would import again (bench.strategies.base.sweep_preloads).  A one-off
# run gains nothing from them: its ranks import them side by side, while the server would import
# them before forking.
_PRELOAD: list[str] = ["bench.worker"]


def preload(modules) -> None:
    """Add modules for the fork server to import.  It imports the list once, when it starts (the
    first run of this process), so a sweep declares the union over its runs before the first."""
    _PRELOAD.extend(m for m in modules if m not in _PRELOAD)


_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# The launcher ends a completed run's processes this long after each rank's own teardown deadline
# (bench/worker.py: faulthandler, which also dumps the rank's Python stacks) should have fired: for
# a process that has left Python and still does not end.
TEARDOWN_GRACE_S = 10


def launch_local(plan: Plan, run_dir: Path) -> Outcome:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from bench.worker import worker_main

    # the deadlines (read here: a config without them fails before anything starts)
    deadlines = (plan.cfg.get("run_timeout_s"), plan.cfg["teardown_timeout_s"] + TEARDOWN_GRACE_S)
    expired: dict = {}  # what ended the run from outside: {"limit": "run_timeout_s" | "teardown_timeout_s"}
    stop_watch = threading.Event()
    start_method = plan.cfg["start_method"]
    _prepare_start_method(start_method)
    saved = {s: signal.getsignal(s) for s in _HANDLED_SIGNALS}
    with tempfile.TemporaryDirectory(prefix="bench_elastic_") as logs:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=plan.world_size,
            run_id=f"bench-{uuid.uuid4().hex[:8]}",
            rdzv_backend="c10d", rdzv_endpoint="localhost:0",  # port 0: the OS picks a free one
            max_restarts=0, monitor_interval=0.2, start_method=start_method,
            logs_specs=DefaultLogsSpecs(log_dir=logs))
        watcher = threading.Thread(target=_watch_deadlines, args=(run_dir, plan.cfg, *deadlines, expired, stop_watch),
                                   name="bench-run-deadlines", daemon=True)
        try:
            watcher.start()
            elastic_launch(config, worker_main)(plan.to_dict(), str(run_dir), True)  # teardown_deadline
            return Outcome("completed")
        except ChildFailedError as e:
            return _outcome_of_failed_child(e, run_dir, plan.cfg, expired)
        except SignalException as e:
            return _outcome_of_signal(e, run_dir, plan.cfg, expired)
        finally:
            stop_watch.set()
            for s, h in saved.items():
                signal.signal(s, h)


def _watch_deadlines(run_dir: Path, cfg: dict, timeout_s, teardown_s: float, expired: dict,
                     stop_watch: threading.Event) -> None:
    """run_timeout_s from the start; teardown_timeout_s (+ grace) from the moment rank 0's
    completed metrics.json appears.  Either sends this process SIGTERM, which the elastic agent
    turns into a shutdown of all workers (SIGTERM, then SIGKILL); ``expired["limit"]`` says which."""
    t0, started, done_at = time.monotonic(), time.time(), None
    metrics = run_dir / "metrics.json"
    while not stop_watch.wait(0.5):
        now = time.monotonic()
        if (done_at is None and metrics.is_file() and metrics.stat().st_mtime >= started
                and _completed_before_exit(run_dir)):  # this launch's result, not an older one
            done_at = now
        if timeout_s and now - t0 > timeout_s:
            expired["limit"] = "run_timeout_s"
            log.error("run exceeded run_timeout_s=%s: terminating its processes", timeout_s)
        elif done_at is not None and now - done_at > teardown_s:
            expired["limit"] = "teardown_timeout_s"
            log.error("the processes did not exit within teardown_timeout_s=%s after the run completed: "
                      "terminating them", cfg["teardown_timeout_s"])
        else:
            continue
        os.kill(os.getpid(), signal.SIGTERM)
        return


def _prepare_start_method(start_method: str) -> None:
    if start_method == "forkserver":
        # ranks fork from a server process that has imported torch and bench.worker (and, in a
        # sweep, _PRELOAD's other modules) once (a sweep's later runs reuse it) instead of each rank
        # re-importing them after a spawn; the server never touches CUDA, so each rank initializes
        # CUDA itself as after a spawn.  With triton installed, importing torch._inductor or
        # megatron.core calls torch.cuda.is_available(), whose default check (cudaGetDeviceCount)
        # marks every later fork as unable to use CUDA; the NVML-based check does not, so the server
        # (which inherits this environment when it starts) and the ranks use that one.
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        multiprocessing.set_forkserver_preload(list(_PRELOAD))


def _outcome_of_failed_child(e, run_dir: Path, cfg: dict, expired: dict) -> Outcome:
    """The outcome of a launch that ended in torch's ChildFailedError ``e``."""
    failures = read_failures(run_dir)
    if expired:
        return _ended_by_limit(run_dir, expired["limit"], cfg, failures)
    killed = _killed_without_record(e, failures)
    if killed is not None and not _completed_before_exit(run_dir):
        return Outcome("failed", killed, failures)
    if failures:
        return from_failures(failures)
    rank, pf = e.get_first_failure()
    if _completed_before_exit(run_dir):
        # every rank finished and rank 0 wrote the results after the final barrier; a
        # process died on its way out (DeepSpeed's rare "terminate called without an
        # active exception") or its teardown hung and was ended: keep the measurement,
        # record the exit.
        _add_exit_warning(run_dir, _exit_after_completion(run_dir, rank, pf.exitcode, cfg))
        return Outcome("completed")
    return Outcome("failed", {"rank": rank, "type": "ChildFailedError",
                              "message": f"rank {rank} exited with code {pf.exitcode}",
                              "traceback": str(e)}, failures)


def _outcome_of_signal(e, run_dir: Path, cfg: dict, expired: dict) -> Outcome:
    """The outcome of a launch that a signal (torch's SignalException ``e``) ended."""
    failures = read_failures(run_dir)
    if expired:
        return _ended_by_limit(run_dir, expired["limit"], cfg, failures)
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
        return None
    rank, pf = killed[0]
    return {"rank": rank, "type": "KilledBySignal",
            "message": f"rank {rank} was killed by signal {-pf.exitcode} ({pf.signal_name()}) without recording an "
                       "error (ended from outside: kill, the kernel's out-of-memory killer)",
            "traceback": None}


def _completed_before_exit(run_dir: Path) -> bool:
    return (read_json_dict(run_dir / "metrics.json") or {}).get("status") == "completed"


def _exit_after_completion(run_dir: Path, rank: int, exitcode: int, cfg: dict) -> str:
    from bench.worker import TEARDOWN_TIMEOUT_HEADER

    ended = sorted(int(p.stem[4:]) for p in run_dir.glob("rank*.log")
                   if TEARDOWN_TIMEOUT_HEADER.search(p.read_text(errors="replace")[-200_000:]))
    if ended:  # a rank waits for its peers in teardown too, so every rank may have been ended
        return (f"the teardown did not finish within teardown_timeout_s={cfg['teardown_timeout_s']} after the run "
                f"completed; rank(s) {', '.join(map(str, ended))} were ended, their threads' Python stacks are at "
                "the end of their rank<N>.log")
    return f"rank {rank} exited with code {exitcode} after the run completed"


def _add_exit_warning(run_dir: Path, message: str) -> None:
    m = read_json_dict(run_dir / "metrics.json")
    m["exit_warning"] = message
    write_json_atomic(run_dir / "metrics.json", m)
    log.warning("%s; the results were already written and are kept", message)


def _ended_by_limit(run_dir: Path, limit: str, cfg: dict, failures: list) -> Outcome:
    """A run ended by run_timeout_s or teardown_timeout_s.  If rank 0 had already written the
    results after the final barrier, only the exit hung (seen with NCCL collectives in CUDA
    graphs, on 2 H200s, also after the ranks had called os._exit): keep the measurement."""
    if _completed_before_exit(run_dir):
        _add_exit_warning(run_dir, f"the processes did not exit within {limit}={cfg[limit]} after the run "
                                   "completed and were terminated")
        return Outcome("completed")
    return Outcome("timeout", timeout_error(cfg["run_timeout_s"]), failures)

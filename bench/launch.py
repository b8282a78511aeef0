"""Start the ranks of one run and turn how they ended into an outcome.

Two ways (DESIGN: "local: torch elastic launch; SLURM: this process IS a rank"):

* :func:`launch_local`: this process starts every rank;
* :func:`launch_task_rank`: inside a submitit/SLURM task, this process is one rank (bench/slurm.py
  sized the job: one task per rank).  A watchdog thread in every rank ends the run on
  ``run_timeout_s`` or when another rank has failed (its failure_rank*.json appears in the shared
  run folder), so one failing rank cannot leave the others waiting in a collective; rank 0 records
  the outcome, the root cause first.

Local runs (every world size, 1 included, so each run gets a fresh process: CUDA memory,
NCCL state and a crash stay inside it) go through torch's elastic launch API, the one
``torchrun`` uses, with a c10d rendezvous on a free port and no restarts.  When any worker
fails, the elastic agent terminates the others and raises ``ChildFailedError``.  A run
that exceeds ``run_timeout_s``, or whose processes outlive ``teardown_timeout_s`` after it
completed, is ended the same way: a watcher thread sends this process SIGTERM, which the agent
turns into a shutdown of all workers (SIGTERM, then SIGKILL).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from bench.jsonio import read_json_dict, write_json_atomic
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


@dataclass
class Outcome:
    status: str  # completed | failed | oom | timeout | interrupted
    error: Optional[dict] = None
    failures: list[dict] = field(default_factory=list)  # failure_rank*.json of the run


def launch_local(plan: Plan, run_dir: Path) -> Outcome:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from bench.worker import worker_main

    timeout_s = plan.cfg.get("run_timeout_s")
    teardown_s = plan.cfg["teardown_timeout_s"] + TEARDOWN_GRACE_S
    expired: dict = {}  # what ended the run from outside: {"limit": "run_timeout_s" | "teardown_timeout_s"}
    stop_watch = threading.Event()

    def _watch() -> None:
        """run_timeout_s from the start; teardown_timeout_s (+ grace) from the moment rank 0's
        completed metrics.json appears.  Either sends this process SIGTERM, which the elastic agent
        turns into a shutdown of all workers (SIGTERM, then SIGKILL)."""
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
                          "terminating them", plan.cfg["teardown_timeout_s"])
            else:
                continue
            os.kill(os.getpid(), signal.SIGTERM)
            return

    start_method = plan.cfg["start_method"]
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
    saved = {s: signal.getsignal(s) for s in _HANDLED_SIGNALS}
    with tempfile.TemporaryDirectory(prefix="bench_elastic_") as logs:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=plan.world_size,
            run_id=f"bench-{uuid.uuid4().hex[:8]}",
            rdzv_backend="c10d", rdzv_endpoint="localhost:0",  # port 0: the OS picks a free one
            max_restarts=0, monitor_interval=0.2, start_method=start_method,
            logs_specs=DefaultLogsSpecs(log_dir=logs))
        watcher = threading.Thread(target=_watch, name="bench-run-deadlines", daemon=True)
        try:
            watcher.start()
            elastic_launch(config, worker_main)(plan.to_dict(), str(run_dir), True)  # teardown_deadline
            return Outcome("completed")
        except ChildFailedError as e:
            failures = read_failures(run_dir)
            if expired:
                return _ended_by_limit(run_dir, expired["limit"], plan.cfg, failures)
            killed = _killed_without_record(e, failures)
            if killed is not None and not _completed_before_exit(run_dir):
                return Outcome("failed", killed, failures)
            if failures:
                return _from_failures(failures)
            rank, pf = e.get_first_failure()
            if _completed_before_exit(run_dir):
                # every rank finished and rank 0 wrote the results after the final barrier; a
                # process died on its way out (DeepSpeed's rare "terminate called without an
                # active exception") or its teardown hung and was ended: keep the measurement,
                # record the exit.
                _add_exit_warning(run_dir, _exit_after_completion(run_dir, rank, pf.exitcode, plan.cfg))
                return Outcome("completed")
            return Outcome("failed", {"rank": rank, "type": "ChildFailedError",
                                      "message": f"rank {rank} exited with code {pf.exitcode}",
                                      "traceback": str(e)}, failures)
        except SignalException as e:
            failures = read_failures(run_dir)
            if expired:
                return _ended_by_limit(run_dir, expired["limit"], plan.cfg, failures)
            if _completed_before_exit(run_dir):
                _add_exit_warning(run_dir, f"interrupted ({e}) during the teardown, after the run completed")
                return Outcome("completed")
            return Outcome("interrupted", {"rank": None, "type": "SignalException", "message": str(e),
                                           "traceback": None}, failures)
        finally:
            stop_watch.set()
            for s, h in saved.items():
                signal.signal(s, h)


def _from_failures(failures: list[dict]) -> Outcome:
    """The outcome the ranks' own records give: the earliest is the root cause."""
    root = failures[0]
    status = "interrupted" if root.get("type") == "KeyboardInterrupt" else ("oom" if root.get("oom") else "failed")
    return Outcome(status, {k: root.get(k) for k in ("rank", "type", "message", "traceback")}, failures)


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
    return Outcome("timeout", _timeout_error(cfg["run_timeout_s"]), failures)


def _timeout_error(timeout_s) -> dict:
    return {"rank": None, "type": "Timeout", "message": f"run exceeded run_timeout_s={timeout_s}; "
            "all its processes were terminated", "traceback": None}


# ---------------------------------------------------------------------------------- a submitit task
def task_rank_environment(world_size: Optional[int] = None) -> dict:
    """This submitit task as a rank: exports RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    (torch.distributed's environment) and says where it runs.

    Exported for a job of one task per rank, a run of world_size 1 in one task included (the worker
    reads RANK/LOCAL_RANK/WORLD_SIZE and a one-rank process group needs MASTER_ADDR/PORT: under real
    SLURM a ``world_size=1`` run died with ``KeyError: 'MASTER_ADDR'``); not for one task that runs
    every rank through torch elastic (world_size > 1 in one task): the agent sets its workers' own."""
    import submitit

    env = submitit.JobEnvironment()
    if env.num_tasks > 1 or world_size is None or env.num_tasks == world_size:
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return {"rank": env.global_rank, "tasks": env.num_tasks, "nodes": env.num_nodes, "job_id": env.job_id,
            "describe": str(env)}


def since_process_start(t: float) -> Optional[float]:
    """Seconds from this process's start (Linux /proc) to t: submitit's own start-up (unpickling, imports)."""
    try:
        btime = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        return t - (btime + ticks / os.sysconf("SC_CLK_TCK"))
    except Exception:
        return None


def no_requeue_on_time_limit_warning() -> None:
    """In a submitit task: the time-limit warning (``--signal=USR2@signal_delay_s``) only logs.  submitit's
    handler would checkpoint the job and requeue it, or raise UncompletedJobError ("timed-out too many
    times", max_num_timeout=0) wherever the main thread is: a benchmark run is not resumable, and
    SLURM may send the warning up to a minute early - with a short time limit at the very start of the
    run.  The run goes on until it ends or SLURM ends it at the limit (recorded as ``timeout``)."""
    sig = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), signal.SIGUSR2)

    def _warned(signum, frame) -> None:
        log.warning("SLURM's time-limit warning (%s): the run goes on until it ends or SLURM ends it",
                    signal.Signals(signum).name)
    try:
        signal.signal(sig, _warned)
    except ValueError:  # not the main thread
        pass


def _noted(signum, frame) -> None:
    """Python-level handler of the signals _TaskSignals watches: nothing (the watchdog thread acts)."""


class _TaskSignals:
    """SIGTERM and submitit's time-limit warning (``--signal=USR2@signal_delay_s``; the signal named by
    SUBMITIT_PREEMPT_SIGNAL) while this rank runs.  The C-level handler writes each signal's number to
    a pipe (``signal.set_wakeup_fd``) that the watchdog thread reads, so a signal is seen even while the
    main thread waits inside a collective.  submitit's own handlers are replaced meanwhile: it ignores
    SIGTERM (SLURM's SIGKILL follows KillWait later: nothing recorded) and, on the warning, raises
    UncompletedJobError("timed-out too many times") wherever the main thread is - right at the start of
    a run when signal_delay_s >= the time limit (SLURM may send it up to a minute early)."""

    def __init__(self) -> None:
        self.warn = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), signal.SIGUSR2)
        self.watched = (signal.SIGTERM, self.warn)
        self.fd: Optional[int] = None
        self._w: Optional[int] = None
        self._saved: dict = {}
        self._old_fd = -1

    def __enter__(self) -> "_TaskSignals":
        try:
            self._saved = {s: signal.getsignal(s) for s in self.watched}
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            for s in self.watched:
                signal.signal(s, _noted)
            self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            self.fd, self._w = r, w
        except ValueError:  # not the main thread: submitit's handlers stay
            self._restore()
        return self

    def wait(self, timeout: float) -> list[int]:
        """The watched signals received, waiting up to timeout for one."""
        import select

        if self.fd is None:
            time.sleep(timeout)
            return []
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        try:
            return [n for n in os.read(self.fd, 256) if n in self.watched]
        except (BlockingIOError, OSError):
            return []

    def _restore(self) -> None:
        for s, h in self._saved.items():
            try:
                signal.signal(s, h if h is not None else signal.SIG_DFL)
            except (ValueError, TypeError):
                pass

    def __exit__(self, *exc) -> None:
        if self.fd is None:
            return
        try:
            signal.set_wakeup_fd(self._old_fd)
        except ValueError:
            pass
        self._restore()
        for fd in (self.fd, self._w):
            os.close(fd)
        self.fd = None


def _slurm_end(jid: Optional[str]) -> Outcome:
    """Why SLURM sent this task SIGTERM: its time limit (squeue's reason ``TimeLimit`` while the job
    completes) -> ``timeout``; else scancel, preemption or a node shutdown -> ``failed``."""
    import shutil
    import subprocess

    state = reason = used = limit = None
    if jid and shutil.which("squeue"):
        # SLURM signals every process of the job step again while it ends it: squeue, a child of this
        # rank, ignores SIGTERM (else it dies without an answer, rc -15), and is asked again if it died
        cmd = ["sh", "-c", 'trap "" TERM; exec squeue -h -t all -j "$0" -o "%T|%r|%M|%l"', jid]
        for _ in range(5):
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=3)
            except (OSError, subprocess.SubprocessError):
                continue
            out = p.stdout.strip().splitlines()
            if p.returncode == 0 and out:
                state, reason, used, limit = (out[0].split("|") + [None] * 4)[:4]
                break
            time.sleep(0.1)
    job = f"SLURM job {jid}" if jid else "the submitit job"
    if reason == "TimeLimit":
        return Outcome("timeout", {"rank": None, "type": "SlurmTimeLimit", "traceback": None,
                                   "message": f"{job} reached its time limit ({limit}: hydra.launcher.timeout_min) "
                                              f"after {used} and SLURM ended it"})
    if state is None:
        return Outcome("failed", {"rank": None, "type": "SlurmEnded", "traceback": None,
                                  "message": f"{job} was ended by SIGTERM (the time limit, scancel, preemption or node "
                                             "shutdown: squeue did not say which)"})
    return Outcome("failed", {"rank": None, "type": "Cancelled", "traceback": None,
                              "message": f"{job} was ended by SIGTERM before its time limit (scancel, preemption or "
                                         f"node shutdown; SLURM: state {state}, reason {reason}, ran {used} of {limit})"})


class _Watchdog(threading.Thread):
    """Ends this rank on run_timeout_s, when another rank has failed, or when SLURM ends the job
    (SIGTERM: the time limit or scancel); rank 0 records it first."""

    def __init__(self, run_dir: Path, rank: int, timeout_s: Optional[float], finalize,
                 signals: Optional[_TaskSignals] = None) -> None:
        super().__init__(daemon=True, name="bench-watchdog")
        self.run_dir, self.rank, self.timeout_s, self.finalize = run_dir, rank, timeout_s, finalize
        self.signals = signals
        self.t0 = time.time()
        self.stopped = threading.Event()
        self.warned = False

    def run(self) -> None:
        while not self.stopped.is_set():
            got = self.signals.wait(0.5) if self.signals is not None else []
            if self.signals is None:
                self.stopped.wait(0.5)
            if self.stopped.is_set():
                return
            if signal.SIGTERM in got:
                self._fire("signal")
            if self.signals is not None and self.signals.warn in got and not self.warned:  # the time-limit warning: a run may still end before the limit
                self.warned = True
                log.warning("rank %d: SLURM's warning signal: the job's time limit is near; the run goes on until "
                            "it ends or SLURM ends it (then recorded as timeout)", self.rank)
            if self.timeout_s and time.time() - self.t0 > self.timeout_s:
                self._fire("timeout")
            peers = [p for p in self.run_dir.glob("failure_rank*.json") if p.name != f"failure_rank{self.rank}.json"]
            if peers:
                time.sleep(1.0)  # let the failing rank's peers write theirs: the earliest is the root cause
                if not self.stopped.is_set():
                    self._fire("peer")

    def _fire(self, why: str) -> None:
        msg = {"timeout": f"run exceeded run_timeout_s={self.timeout_s}", "peer": "another rank failed",
               "signal": "SIGTERM from SLURM (time limit or scancel)"}[why]
        log.error("rank %d: %s: ending this rank", self.rank, msg)
        if self.rank == 0:
            try:
                self.finalize(why)
            except BaseException:
                log.exception("recording the outcome failed")
        else:
            time.sleep(2.0)  # give rank 0 the time to record the outcome
        logging.shutdown()
        os._exit(1)


def launch_task_rank(plan: Plan, run_dir: Path, rank: int, record: Callable[[Outcome], str]) -> str:
    """Run this task's rank; rank 0 hands the run's outcome to ``record`` once (a watchdog may do it
    first) and returns what it returns; another rank returns how its own part ended."""
    from bench.worker import worker_main

    lock = threading.Lock()
    recorded: list[str] = []

    def finalize(why: str, exc: Optional[BaseException] = None) -> str:
        with lock:
            if not recorded:
                recorded.append(record(_task_outcome(why, exc, read_failures(run_dir), rank, plan.cfg)))
            return recorded[0]

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)  # worker_main reconfigures logging for its rank files
    exc: Optional[BaseException] = None
    with _TaskSignals() as signals:
        dog = _Watchdog(run_dir, rank, plan.cfg.get("run_timeout_s"), finalize, signals)
        dog.start()
        try:
            worker_main(plan.to_dict(), str(run_dir))
        except BaseException as e:  # KeyboardInterrupt included: recorded as interrupted
            exc = e
        finally:
            dog.stopped.set()
            dog.join(timeout=5.0)  # before the signal pipe closes under it
            for h in root.handlers[:]:
                root.removeHandler(h)
                h.close()
            for h in saved[0]:
                root.addHandler(h)
            root.setLevel(saved[1])
    if rank != 0:
        return "completed" if exc is None else "failed"
    if exc is not None:
        time.sleep(1.0)  # the peers' failure files: the earliest is the root cause
    return finalize("completed" if exc is None else "failed", exc)


def _task_outcome(why: str, exc: Optional[BaseException], failures: list[dict], rank: int, cfg: dict) -> Outcome:
    if why == "completed":
        return Outcome("completed", None, failures)
    if why == "timeout":
        return Outcome("timeout", _timeout_error(cfg["run_timeout_s"]), failures)
    if why == "signal":  # SLURM ended the job: that is the root cause, whatever the ranks recorded since
        o = _slurm_end(os.environ.get("SLURM_JOB_ID"))
        return Outcome(o.status, o.error, failures)
    if failures:
        return _from_failures(failures)
    return Outcome("failed", {"rank": rank, "type": type(exc).__name__ if exc else "Unknown", "message": str(exc),
                              "traceback": None}, failures)

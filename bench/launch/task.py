"""Inside a submitit/SLURM task this process is one rank of the run (bench/launch/__init__.py)."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from bench.jsonio import read_json_dict
from bench.launch.outcome import Outcome, from_failures, timeout_error
from bench.machine.placement import node_note, read_placements, write_placement
from bench.run.runs import read_failures
from bench.spec.schema import BenchConfig, Plan
from bench.launch.teardown import failed_teardown_s

log = logging.getLogger("bench.launch")


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
        if env.num_tasks == 1:  # a port of its own: submitit's is derived from the job id, and another process on the
            os.environ["MASTER_PORT"] = str(_free_port())  # node may hold it (seen: EADDRINUSE under a loaded CI)
    return {"rank": env.global_rank, "tasks": env.num_tasks, "nodes": env.num_nodes, "job_id": env.job_id,
            "describe": str(env)}


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


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


def _ask_slurm(*cmd: str) -> Optional[list[str]]:
    """The output lines of a SLURM client (squeue, sinfo) run from a task SLURM is ending, or None.
    SLURM signals every process of the job step again while it ends it: the client, a child of this
    rank, ignores SIGTERM (else it dies without an answer, rc -15), and is asked again if it died."""
    import shutil
    import subprocess

    if not shutil.which(cmd[0]):
        return None
    for _ in range(5):
        try:
            p = subprocess.run(["sh", "-c", 'trap "" TERM; exec "$@"', "sh", *cmd], capture_output=True, text=True,
                               timeout=3)
        except (OSError, subprocess.SubprocessError):
            continue
        out = p.stdout.strip().splitlines()
        if p.returncode == 0 and out:
            return out
        time.sleep(0.1)
    return None


_NODE_DOWN = ("down", "fail", "failing", "drain", "draining", "drained")  # sinfo %T, its flags (*~#!%$@^-) cut


def _failed_nodes() -> Optional[str]:
    """This job's nodes that SLURM has DOWN or failing, with its reason ("node2 down* (Not responding)")."""
    nodes = os.environ.get("SLURM_JOB_NODELIST")
    rows = [line.split("|") for line in (_ask_slurm("sinfo", "-h", "-N", "-n", nodes, "-o", "%N|%T|%E") or [])] \
        if nodes else []
    bad = [f"{n} {st} ({why})" for n, st, why in (r for r in rows if len(r) == 3)
           if st.rstrip("*~#!%$@^-").lower() in _NODE_DOWN]
    return ", ".join(dict.fromkeys(bad)) or None


def _slurm_end(jid: Optional[str]) -> Outcome:
    """Why SLURM sent this task SIGTERM: its time limit (squeue's reason ``TimeLimit`` while the job
    completes) -> ``timeout``; else scancel, preemption, a node shutdown or a failed node -> ``failed``
    (a failed node - reason NodeDown / NodeFail - named, as sinfo has it)."""
    state = reason = used = limit = None
    out = _ask_slurm("squeue", "-h", "-t", "all", "-j", jid, "-o", "%T|%r|%M|%l") if jid else None
    if out:
        state, reason, used, limit = (out[0].split("|") + [None] * 4)[:4]
    job = f"SLURM job {jid}" if jid else "the submitit job"
    if reason == "TimeLimit":
        return Outcome("timeout", {"rank": None, "type": "SlurmTimeLimit", "traceback": None,
                                   "message": f"{job} reached its time limit ({limit}: hydra.launcher.timeout_min) "
                                              f"after {used} and SLURM ended it"})
    if state is None:
        why = " (the time limit, scancel, preemption or node shutdown: squeue did not say which)" if jid else ""
        return Outcome("failed", {"rank": None, "type": "SlurmEnded" if jid else "Terminated", "traceback": None,
                                  "message": f"{job} was ended by SIGTERM{why}"})
    if state == "NODE_FAIL" or reason in ("NodeDown", "NodeFail"):
        nodes = _failed_nodes()
        return Outcome("failed", {"rank": None, "type": "NodeFail", "traceback": None,
                                  "message": f"{job} was ended by SLURM because a node failed: "
                                             f"{nodes or 'sinfo did not say which'} (SLURM: state {state}, reason "
                                             f"{reason}, ran {used} of {limit})"})
    return Outcome("failed", {"rank": None, "type": "Cancelled", "traceback": None,
                              "message": f"{job} was ended by SIGTERM before its time limit (scancel, preemption or "
                                         f"node shutdown; SLURM: state {state}, reason {reason}, ran {used} of "
                                         f"{limit})"})


class _Watchdog(threading.Thread):
    """Ends this rank on run_timeout_s, when another rank has failed, when this rank failed and its
    teardown outlasts ``failed_s`` (after an out-of-memory inside a CUDA graph capture on 4 H100s the
    failing rank never got out of it), or when SLURM ends the job (SIGTERM: the time limit or
    scancel); rank 0 records it first."""

    def __init__(self, run_dir: Path, rank: int, timeout_s: Optional[float], finalize,
                 signals: Optional[_TaskSignals] = None, failed_s: float = 5.0) -> None:
        super().__init__(daemon=True, name="bench-watchdog")
        self.run_dir, self.rank, self.timeout_s, self.finalize = run_dir, rank, timeout_s, finalize
        self.signals, self.failed_s = signals, failed_s
        self.t0 = time.time()
        self.stopped = threading.Event()
        self.warned = False
        self.failed_at: Optional[float] = None  # when this rank's own failure record appeared

    def run(self) -> None:
        while not self.stopped.is_set():
            if self.signals is not None:
                got = self.signals.wait(0.5)
            else:
                got = []
                self.stopped.wait(0.5)
            if self.stopped.is_set():
                return
            if signal.SIGTERM in got:
                self._fire("signal")
            if self.signals is not None and self.signals.warn in got and not self.warned:
                self.warned = True  # the time-limit warning: the run may still end before the limit
                log.warning("rank %d: SLURM's warning signal: the job's time limit is near; the run goes on until "
                            "it ends or SLURM ends it (then recorded as timeout)", self.rank)
            if self.timeout_s and time.time() - self.t0 > self.timeout_s:
                self._fire("timeout")
            if self._own_teardown_outlasted():
                self._fire("self")
            peers = [p for p in self.run_dir.glob("failure_rank*.json") if p.name != f"failure_rank{self.rank}.json"]
            if peers:
                time.sleep(1.0)  # let the failing rank's peers write theirs: the earliest is the root cause
                if not self.stopped.is_set():
                    self._fire("peer")

    def _own_teardown_outlasted(self) -> bool:
        """This rank recorded its failure more than failed_s ago and is still here: its teardown blocks."""
        if self.failed_at is None and (self.run_dir / f"failure_rank{self.rank}.json").is_file():
            self.failed_at = time.time()
        return self.failed_at is not None and time.time() - self.failed_at > self.failed_s

    def _fire(self, why: str) -> None:
        msg = {"timeout": f"run exceeded run_timeout_s={self.timeout_s}", "peer": "another rank failed",
               "self": f"this rank failed and its teardown did not end within {self.failed_s:.0f} s",
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
    from bench.launch.worker import worker_main

    lock = threading.Lock()
    recorded: list[str] = []

    def finalize(why: str, exc: Optional[BaseException] = None) -> str:
        with lock:
            if not recorded:
                recorded.append(record(_task_outcome(why, exc, read_failures(run_dir), rank, plan.run, run_dir)))
            return recorded[0]

    write_placement(run_dir, rank)  # where this rank runs: a failure can name the node of ranks that left nothing
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)  # worker_main reconfigures logging for its rank files
    exc: Optional[BaseException] = None
    with _TaskSignals() as signals:
        dog = _Watchdog(run_dir, rank, plan.run.run_timeout_s, finalize, signals, failed_teardown_s(plan.run))
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


def _task_outcome(why: str, exc: Optional[BaseException], failures: list[dict], rank: int, run: BenchConfig,
                  run_dir: Optional[Path] = None) -> Outcome:
    if why == "completed":
        return Outcome("completed", None, failures)
    if why == "timeout" and not failures:  # a failure recorded before the limit is the root cause (oom stays oom)
        return Outcome("timeout", timeout_error(run.run_timeout_s), failures)
    if why == "signal":  # SLURM ended the job: that is the root cause, whatever the ranks recorded since
        st = (read_json_dict(run_dir / "status.json") or {}) if run_dir is not None else {}
        if st.get("status") == "interrupted":  # the sweep was stopped (Ctrl-C) and cancelled its jobs
            return Outcome("interrupted", {"rank": None, "type": "KeyboardInterrupt", "traceback": None,
                                           "message": st.get("reason") or "interrupted"}, failures)
        o = _slurm_end(os.environ.get("SLURM_JOB_ID"))
        return Outcome(o.status, o.error, failures)
    if failures:
        return _with_nodes(from_failures(failures), run_dir)
    return Outcome("failed", {"rank": rank, "type": type(exc).__name__ if exc else "Unknown", "message": str(exc),
                              "traceback": None}, failures)


def _with_nodes(o: Outcome, run_dir: Optional[Path]) -> Outcome:
    """On several nodes, a root cause that is a lost connection names the node it points to (and whether
    that node's ranks left any record), or says how to fix a peer reached at a loopback address."""
    note = node_note(o.failures, read_placements(run_dir)) if run_dir is not None and o.error else None
    if note:
        o.error = {**o.error, "message": f"{o.error.get('message')} [{note}]"}
        log.error("%s", note)
    return o

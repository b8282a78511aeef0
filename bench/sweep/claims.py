"""Several sweep processes on one sweep folder at once: who runs which job.

Two ``--multirun`` commands started on one ``hydra.sweep.dir`` (with ``resume=true``, to share the
work; or by mistake) each plan every job.  Without coordination both run every job, and one moves
the other's run folder aside while it is being written.  Coordination, all in the sweep folder:

* ``.claims/lock``: an exclusive ``fcntl.flock`` held while a sweep plans (scans the folder,
  chooses run folders, writes their pending status) and while it claims a job;
* ``.claims/<run folder>.json``: the claim of the process that runs into that folder (its pid,
  process start time and host), written under the lock just before the run starts and removed when
  it ends.  A claim whose process is gone (``kill -9``, a crash: same host, pid no longer there
  or a different process start time) is stale: the next sweep to look removes it.  A claim made on
  another host cannot be checked and counts as live.

bench/sweep/sweeper.py: a run folder claimed by another live process is never chosen, moved aside or
written; with ``resume=true`` a job whose key another live process has claimed is left to it (the
sweep waits for it and reports its result), and one that another sweep completed meanwhile is not
run again.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from bench.jsonio import read_json_dict, write_json_atomic

CLAIMS = ".claims"
LOCK = "lock"


def _start_time(pid) -> Optional[str]:
    """The process's start time (field 22 of /proc/<pid>/stat: clock ticks since boot), None if no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, ValueError, TypeError, IndexError):
        return None


def owner() -> dict:
    """This process, as a claim records it."""
    return {"pid": os.getpid(), "start": _start_time(os.getpid()), "host": socket.gethostname()}


def is_me(who: Optional[dict]) -> bool:
    return bool(who) and who.get("pid") == os.getpid() and who.get("host") == socket.gethostname() \
        and who.get("start") == _start_time(os.getpid())


def alive(who: Optional[dict]) -> bool:
    if not who:
        return False
    if who.get("host") != socket.gethostname():
        return True  # another machine: cannot be checked from here
    return who.get("start") is not None and _start_time(who.get("pid")) == who.get("start")


@contextmanager
def locked(sweep_dir: Path) -> Iterator[None]:
    """Hold the sweep folder's lock (creates the folder and .claims/)."""
    d = Path(sweep_dir) / CLAIMS
    d.mkdir(parents=True, exist_ok=True)
    with open(d / LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def live_claims(sweep_dir: Path, prune: bool = True) -> dict[str, dict]:
    """Run folder name -> claim, for the claims whose process still runs (``prune``: delete the stale
    ones; call it holding the lock)."""
    out = {}
    d = Path(sweep_dir) / CLAIMS
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        c = read_json_dict(p)
        if c is None or not alive(c.get("owner")):
            if prune:
                p.unlink(missing_ok=True)
            continue
        out[str(c.get("dir"))] = c
    return out


def claim(sweep_dir: Path, run_dir_name: str, key: Optional[str]) -> None:
    """Record that this process runs into ``run_dir_name`` (hold the lock)."""
    write_json_atomic(Path(sweep_dir) / CLAIMS / f"{run_dir_name}.json",
                      {"dir": run_dir_name, "key": key, "owner": owner(), "time": time.time()})


def release(sweep_dir: Path, run_dir_name: str) -> None:
    """Drop this process's claim on ``run_dir_name`` (no lock needed: only its owner removes a live claim)."""
    p = Path(sweep_dir) / CLAIMS / f"{run_dir_name}.json"
    c = read_json_dict(p)
    if c is not None and is_me(c.get("owner")):
        p.unlink(missing_ok=True)

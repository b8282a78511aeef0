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

:class:`SweepFolder` (this process's share of the folder, used by bench/sweep/sweeper.py and
bench/sweep/runner.py): a run folder claimed by another live process is never chosen, moved aside or
written; with ``resume=true`` a job whose key another live process has claimed is left to it (the
sweep waits for it and reports its result), and one that another sweep completed meanwhile is not
run again.  It also writes what each planned run folder shows before it runs and the sweep's
manifest (``sweep.json``).
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from bench.jsonio import read_json_dict, write_json_atomic
from bench.metrics import STATUSES, skeleton
from bench.run.runs import ATTEMPTS, move_aside, read_result, scan
from bench.sweep.jobs import subdir_override
from bench.sweep.status_report import MANIFEST

if TYPE_CHECKING:
    from bench.sweep.jobs import Job

log = logging.getLogger("bench.sweep")

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


class SweepFolder:
    """This sweep process's share of a sweep folder: the run folders it chooses (never one another live
    process claimed), what a planned folder shows before it runs, the claim of each job just before it
    runs, and the manifest (``sweep.json``) of every job it planned."""

    def __init__(self, sweep_dir: Path, manifest: dict, resume: bool) -> None:
        self.sweep_dir = sweep_dir
        self.manifest = manifest
        self.resume = resume
        self.jobs: list[Job] = []  # every job this process recorded, in the manifest's order
        self.busy: set[str] = set()  # run folders claimed by other live sweep processes
        self.t_plan = time.time()

    def others(self, prune: bool = True) -> dict[str, dict]:
        """Run folder -> claim of the other live sweep processes (``prune``: hold the lock); they are busy."""
        out = {name: c for name, c in live_claims(self.sweep_dir, prune=prune).items() if not is_me(c.get("owner"))}
        self.busy = set(out)
        return out

    # -- run folders
    def choose(self, job: Job, taken: set[str], prefer: Sequence[str] = ()) -> str:
        base = str(job.num)
        names = [*prefer, base, f"{base}_{job.key[:8]}"] + [f"{base}_{job.key[:8]}_{i}" for i in range(2, 10_000)]
        for name in names:
            if self.free(name, job, taken):
                return name
        raise RuntimeError(f"no free folder for job {job.num} in {self.sweep_dir}")

    def choose_again(self, j: Job, jobs: Sequence[Job]) -> None:
        """Another sweep process took the folder planned for j: the first free one not planned for jobs."""
        j.dir = self.choose(j, {x.dir for x in jobs if x is not j and x.action != "skip" and x.dir})

    def free(self, name: str, job: Job, taken: set[str]) -> bool:
        """Not planned for another job nor claimed by another live process (busy); empty, a stale attempt,
        or this configuration's own failed / invalid one."""
        if name in taken or name in self.busy:
            return False
        d = self.sweep_dir / name
        r = read_result(d) if d.is_dir() else None
        return r is None or r.status not in STATUSES or (r.status != "completed" and r.key == job.key)

    def prepare(self, job: Job) -> None:
        """Write what a planned job's folder shows before it runs."""
        d = self.sweep_dir / job.dir
        old = read_result(d) if d.is_dir() else None
        rerecord = job.action in ("invalid", "skipped") and old is not None and old.status == job.action
        # a pending status and nothing else (planned by a sweep, never started) is no attempt to keep
        rerecord |= old is not None and old.status == "pending" and \
            [p.name for p in d.iterdir() if p.name != ATTEMPTS] == ["status.json"]
        if d.is_dir() and not rerecord and any(p.name != ATTEMPTS for p in d.iterdir()):
            dest = move_aside(d)
            log.info("[sweep] job #%d: earlier attempt in %s/ moved to %s", job.num, job.dir,
                     dest.relative_to(self.sweep_dir))
        d.mkdir(parents=True, exist_ok=True)
        base = {"key": job.key, **job.ident, "overrides": job.record()["overrides"], "time": time.time(),
                "sweep": owner()}  # the sweep process that planned it
        if job.action in ("invalid", "skipped"):
            m = skeleton(job.cfg or {}, job.action, job.error)
            if job.memory is not None:
                m["memory"]["plan"] = job.memory
            m["job"] = {"key": job.key, "wall_s": 0.0, "startup_s": None, "teardown_s": None, "overhead_s": None,
                        "recorded_by": "sweep pre-check (no process started)"}
            write_json_atomic(d / "metrics.json", m)
            write_json_atomic(d / "status.json", {"status": job.action, **base, "reason": job.reason, "wall_s": 0.0})
        else:
            write_json_atomic(d / "status.json", {"status": "pending", **base})

    def record(self, jobs: list[Job], config: DictConfig) -> None:
        """Write multirun.yaml, each planned folder's status and the manifest, holding the sweep folder's
        lock: another sweep process on this folder sees either none or all of these folders."""
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        with locked(self.sweep_dir):
            OmegaConf.save(config, self.sweep_dir / "multirun.yaml")
            # the folders were chosen while planning, without the lock: another sweep process may have
            # claimed one (and started writing into it) or completed a run in it since: choose again
            self.others()
            for j in jobs:
                if j.action != "skip":
                    if not self.free(j.dir, j, set()):
                        self.choose_again(j, self.jobs + jobs)
                    self.prepare(j)
            self.jobs += jobs
            self.write_manifest()

    def write_manifest(self) -> None:
        self.manifest["jobs"] = [x.record() for x in self.jobs]
        write_json_atomic(self.sweep_dir / MANIFEST, self.manifest)

    def stopped(self) -> None:
        """The sweep was interrupted: the manifest says so."""
        self.manifest["interrupted"] = True
        write_json_atomic(self.sweep_dir / MANIFEST, self.manifest)

    # -- claims
    def claim_job(self, j: Job) -> str:
        """Claim job j just before it runs: "run" (claimed, into j.dir), "done" (with resume=true:
        another sweep completed it, or ran it since this one planned: it is not run twice) or "busy"
        (with resume=true: another live sweep process runs it now; wait for it)."""
        with locked(self.sweep_dir):
            others = self.others()
            if self.resume:
                got = self._elsewhere(j, others)
                if got:
                    return got
            st = read_json_dict(self.sweep_dir / j.dir / "status.json") or {}
            if j.dir in others or not (st.get("status") == "pending" and is_me(st.get("sweep"))):
                # another sweep process took the folder planned for it: choose again
                old = j.dir
                self.choose_again(j, self.jobs)
                self.prepare(j)
                j.overrides = [o for o in j.overrides if not o.startswith("hydra.sweep.subdir=")] + \
                    [subdir_override(j.dir)]
                log.info("[sweep] job #%d: %s/ was taken by another sweep process: runs into %s/", j.num, old, j.dir)
                self.write_manifest()
            claim(self.sweep_dir, j.dir, j.key)
            return "run"

    def _elsewhere(self, j: Job, others: dict[str, dict]) -> Optional[str]:
        """With resume=true, hold the lock: "busy" when another live process has claimed j's key, "done"
        when another sweep completed it (or ran it since this one planned), else None."""
        held = [name for name, c in others.items() if c.get("key") == j.key]
        if held:
            j.reason = f"being run by another sweep (pid {others[held[0]]['owner'].get('pid')}) in {held[0]}/"
            return "busy"
        same = [r for r in scan(self.sweep_dir) if r.key == j.key]
        done = [r for r in same if r.status == "completed"] or \
            [r for r in same if r.status in STATUSES and (r.info.get("time") or 0) > self.t_plan]
        if done:
            self.leave(j.dir)
            j.action, j.dir = "skip", done[0].dir.name
            j.reason = f"{done[0].status} by another sweep in {done[0].dir.name}/"
            self.write_manifest()
            return "done"
        return None

    def leave(self, name: Optional[str]) -> None:
        """Remove the pending status this process planned into a folder it will not run into."""
        if not name:
            return
        d = self.sweep_dir / name
        st = read_json_dict(d / "status.json") or {}
        if st.get("status") == "pending" and is_me(st.get("sweep")):
            (d / "status.json").unlink(missing_ok=True)
            try:
                d.rmdir()
            except OSError:
                pass

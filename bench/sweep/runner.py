"""Running a sweep's planned jobs: one at a time (local launchers: a live ``run i/N`` line each, a stop
at the sweeper's budget, a stop after a run that ended ``interrupted``) or all at once
(``hydra/launcher=slurm``).  Each job is claimed just before it runs and released when it ends
(bench/sweep/claims.py: another sweep process on the same folder may run some of them)."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

from hydra.core.utils import JobStatus
from omegaconf import OmegaConf

from bench.jsonio import write_json_atomic
from bench.run.runs import mark_unfinished, read_result
from bench.sweep import claims
from bench.sweep.claims import SweepFolder
from bench.sweep.cost import fmt_s
from bench.sweep.jobs import Job
from bench.sweep.status_report import progress

log = logging.getLogger("bench.sweep")


class Runner:
    """Launches the jobs a sweeper planned into ``folder`` through Hydra's ``launcher``; ``over_budget()``
    says why no further run should start (None: go on); ``ended(job)``, where given, is called after each run
    that ends on its own, one at a time (the knob search writes what it has measured so far)."""

    def __init__(self, folder: SweepFolder, launcher: Any, over_budget: Callable[[], Optional[str]],
                 ended: Optional[Callable[[Job], None]] = None) -> None:
        self.folder = folder
        self.sweep_dir = folder.sweep_dir
        self.launcher = launcher
        self.over_budget = over_budget
        self.ended = ended

    def run(self, to_run: list[Job], sequential: bool) -> list:
        return self.run_sequential(to_run) if sequential else self.run_parallel(to_run)

    def next(self, queue: list[Job], waiting: set[int]) -> Optional[Job]:
        """The first job of the queue this process claims (None: every one left is run by another sweep)."""
        for cand in list(queue):
            got = self.folder.claim_job(cand)
            if got == "busy":
                if cand.num not in waiting:
                    waiting.add(cand.num)
                    log.info("[sweep] job #%d is %s: waiting for it", cand.num, cand.reason)
                continue
            queue.remove(cand)
            if got == "done":
                log.info("[sweep] job #%d: %s: not run again", cand.num, cand.reason)
                continue
            return cand
        return None

    # -- one at a time
    def run_sequential(self, to_run: list[Job]) -> list:
        returns: list = []
        queue, waiting = list(to_run), set()
        while queue:
            stop = self.over_budget()
            if stop:
                self._leave_pending(queue, stop)
                break
            try:
                j = self.next(queue, waiting)
            except KeyboardInterrupt:
                self.folder.stopped()
                log.error("[sweep] interrupted while waiting for another sweep's runs: stopping the sweep")
                break
            if j is None:  # every job left is being run by another sweep process: wait for it
                if queue:
                    time.sleep(1.0)
                continue
            if self._run_one(j, to_run, queue, returns):
                break
        return returns

    def _leave_pending(self, queue: list[Job], stop: str) -> None:
        """The budget is spent: the jobs left stay pending, with the reason."""
        log.warning("[sweep] %s: %d run(s) not started (status pending)", stop, len(queue))
        for rest in queue:
            write_json_atomic(self.sweep_dir / rest.dir / "status.json",
                              {**(read_result(self.sweep_dir / rest.dir).info or {}), "status": "pending",
                               "reason": stop, "time": time.time()})

    def _run_one(self, j: Job, to_run: list[Job], queue: list[Job], returns: list) -> bool:
        """Launch claimed job j (its return appended to returns) and release it; True: stop the sweep."""
        i = to_run.index(j)
        try:
            est = f", estimate {fmt_s(j.estimate_s)}" if j.estimate_s is not None else ""
            log.info("[sweep] run %d/%d (job #%d -> %s/): %s%s | so far: %s", i + 1, len(to_run), j.num, j.dir,
                     " ".join(j.record()["overrides"]), est, progress(self.sweep_dir, to_run[:i]))
            t0 = time.time()
            try:
                returns.append(self.launcher.launch([j.overrides], initial_job_idx=j.num))
            except KeyboardInterrupt:
                mark_unfinished(self.sweep_dir / j.dir, j.cfg, "interrupted", "KeyboardInterrupt",
                                "Ctrl-C (KeyboardInterrupt) in the sweep process")
                self.folder.stopped()
                log.error("[sweep] interrupted during run %d/%d: stopping the sweep", i + 1, len(to_run))
                return True
            ret = returns[-1][0] if returns[-1] else None
            if ret is not None and ret.status == JobStatus.FAILED:  # the task function itself raised
                e = ret._return_value
                log.error("[sweep] job #%d raised %s: %s", j.num, type(e).__name__, e, exc_info=e)
                mark_unfinished(self.sweep_dir / j.dir, j.cfg, "failed", type(e).__name__,
                                f"the job raised {type(e).__name__}: {e}")
            self._check_folder(j, ret)
            r = read_result(self.sweep_dir / j.dir)
            status = r.status if r else "unknown"
            log.info("[sweep] run %d/%d (job #%d) ended %s in %.1f s", i + 1, len(to_run), j.num, status,
                     time.time() - t0)
            if self.ended is not None:
                self.ended(j)
            if status == "interrupted":
                self.folder.stopped()
                log.error("[sweep] run %d/%d was interrupted: stopping the sweep (%d runs not started; "
                          "resume=true continues it)", i + 1, len(to_run), len(queue))
                return True
            return False
        finally:
            claims.release(self.sweep_dir, j.dir)

    def _check_folder(self, j: Job, ret: Any) -> None:
        """Say so when the launcher ran job j into another folder than j.dir, the one the sweep reads its
        status from (an unquoted ``hydra.sweep.subdir=1_67436339`` once ran into ``167436339/``)."""
        out = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir") if ret is not None and \
            ret.hydra_cfg is not None else None
        want = (self.sweep_dir / j.dir).resolve()
        if out is not None and Path(str(out)).resolve() != want:
            log.error("[sweep] job #%d ran into %s, not into its planned folder %s: its status there is not "
                      "this sweep's", j.num, out, want)

    # -- all at once
    def run_parallel(self, to_run: list[Job]) -> list:
        claimed = []
        for j in to_run:  # another sweep process's runs are not submitted again (not waited for either)
            if self.folder.claim_job(j) == "run":
                claimed.append(j)
            else:
                log.info("[sweep] job #%d: %s: not submitted", j.num, j.reason)
        if not claimed:
            return []
        log.info("[sweep] launching %d runs at once through %s", len(claimed), type(self.launcher).__name__)
        if hasattr(self.launcher, "job_nums"):
            self.launcher.job_nums = [j.num for j in claimed]
        try:
            return [self.launcher.launch([j.overrides for j in claimed], initial_job_idx=0)]
        except KeyboardInterrupt:
            self.folder.stopped()
            for j in claimed:
                mark_unfinished(self.sweep_dir / j.dir, j.cfg, "interrupted", "KeyboardInterrupt",
                                "Ctrl-C in the sweep process: job cancelled")
            log.error("[sweep] interrupted: submitted jobs cancelled")
            return []
        finally:
            for j in claimed:
                claims.release(self.sweep_dir, j.dir)

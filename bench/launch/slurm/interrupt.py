"""Ctrl-C in the sweep process: its unfinished runs are recorded ``interrupted`` BEFORE their jobs are
cancelled, so the ranks, ended by SLURM's SIGTERM, keep that status (a cancelled run is otherwise
``failed``) and ``resume=true`` runs them again."""
from __future__ import annotations

from bench.launch.slurm.record import job_dir, log, mark_failed


def cancel_unfinished(executor: str, submitted: list) -> None:
    """Record every submitted job not done yet as interrupted, then cancel it (scancel); never raises,
    so the KeyboardInterrupt that called it goes on up."""
    from bench.run.runs import read_result

    for num, _, sc, job in submitted:
        if job.done():
            continue
        try:
            d = job_dir(sc, num)
            r = read_result(d) if d.is_dir() else None
            mark_failed(d, sc, "Ctrl-C in the sweep process: job cancelled", r.info if r else {}, "interrupted")
        except Exception:
            log.exception("[%s] #%d: recording the interruption failed", executor, num)
        try:
            job.cancel(check=False)
        except Exception:
            pass

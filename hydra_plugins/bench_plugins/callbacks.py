"""One run submitted without ``--multirun`` (``python -m bench hydra/launcher=slurm ...``: bench/__main__.py
makes it a one-job sweep) exits as a single run does: a sweep exits 0 with runs that were invalid or predicted
not to fit (recorded; the sweep went on), a single run 2 / 3 (bench/launch/job.py ``exit_code``).  It replaces the
sweep's summary callback (Hydra calls end callbacks in reverse order, so one added after it would run first)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bench.jsonio import read_json_dict
from bench.sweep.status_report import SUMMARY, SweepCallback, waits

log = logging.getLogger("bench.sweep")


class SingleRunSweepCallback(SweepCallback):
    """The sweep's summary (which exits on failed / interrupted runs), then the exit code of its one run."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from bench.launch.job import exit_code

        super().on_multirun_end(config, **kwargs)
        if OmegaConf.select(config, "hydra.sweeper.dry_run", default=False) or config.get("dry_run"):
            return  # nothing ran, no summary written
        if not waits(config):
            return  # submitted and left queued (hydra.launcher.wait=false): python -m bench.sweep.collect reports it
        rows = (read_json_dict(Path(str(config.hydra.sweep.dir)) / SUMMARY) or {}).get("rows") or []
        code = exit_code(rows[0]["status"]) if len(rows) == 1 else 0
        if code:
            log.info("[sweep] one run, %s: exit %d, as a single run", rows[0]["status"], code)
            raise SystemExit(code)

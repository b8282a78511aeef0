"""Refuse an output folder that cannot be written, before anything runs.

Hydra creates the run folder (``hydra.run.dir``) only when the job starts, and bench writes into
it from then on: a folder that cannot be created or written (a path under a file, a read-only or
virtual file system) ended the run with a traceback, and - on a file system that fails later -
could lose a measurement after it was made.  :class:`OutputDirCheck` (``hydra.callbacks.
bench_output_dir`` in conf/config.yaml) creates the folder and writes a probe file in it before
Hydra starts the job, or the sweep plans its runs; if it cannot, the command ends with one line
naming the folder and exit code 2 (a configuration error, like an invalid run).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

EXIT_UNWRITABLE = 2


def unwritable(folder: str) -> Optional[str]:
    """Why ``folder`` cannot be created and written (None: it can)."""
    d = Path(folder)
    probe = d / f".bench_write_probe_{os.getpid()}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return e.strerror or str(e)
    return None


def refuse_unwritable(folder: str, key: str) -> None:
    why = unwritable(folder)
    if why is not None:
        print(f"bench: cannot write the output folder {folder} ({key}): {why}; nothing was run",
              file=sys.stderr, flush=True)
        raise SystemExit(EXIT_UNWRITABLE)


class OutputDirCheck(Callback):
    """hydra.run.dir (a single run) / hydra.sweep.dir (a sweep, unless a dry run) must be writable."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_unwritable(str(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if OmegaConf.select(config, "hydra.sweeper.dry_run", default=False):
            return  # a dry run writes nothing
        refuse_unwritable(str(config.hydra.sweep.dir), "hydra.sweep.dir")

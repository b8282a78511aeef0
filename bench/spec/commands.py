"""A run's overrides as words: the key an override sets, and the command that runs one setting once.

Pure string functions, below everything that names a run by its command line (the store of measured bests,
the planner, the sweeper, the analysis)."""
from __future__ import annotations

import shlex

SEARCH_EXPERIMENT = "+experiment=tune"  # the knob search's preset: its trials' run lengths are its rungs'


def override_key(override: str) -> str:
    """The dotted key an override string sets ("+strategy.x=1" -> "strategy.x")."""
    return override.split("=", 1)[0].lstrip("+~")


def rerun_command(overrides: list[str]) -> str:
    """``python -m bench ...`` for one setting: a sweep's or search's overrides without their machinery
    (hydra.* folders, --multirun, resume, the search's preset and its rung lengths: a winner found at
    10 short steps is meant to be run at the default length)."""
    trial = SEARCH_EXPERIMENT in overrides
    keep = [o for o in overrides
            if not o.startswith(("hydra.sweep.", "hydra.run.", "hydra.job.", "hydra.sweeper.", "--multirun", "-m",
                                 "resume="))
            and o != SEARCH_EXPERIMENT
            and not (trial and override_key(o) in ("steps", "warmup_steps"))]
    return " ".join(["python -m bench", *map(shlex.quote, keep)])

"""One candidate layout: validated, its memory planned, its throughput predicted, its days and GPU-hours.

A candidate is a composed base config (one strategy) plus *changes* (dotted key -> value).  Each goes
through ``bench.run.config.validate`` as a dry run (so a hardware preset is planned on any machine); one that
does not validate is counted, not ranked.  The verdict is the memory plan's (bench/plan/memory_model.py); a plan
that does not fit gets no prediction: it cannot run, so no tokens/s is stated for it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Optional

from bench.run.config import validate
from bench.plan.memory_model import memory_plan
from bench.plan.predict import device_hardware
from bench.plan.prediction_text import case_words, layout_words, predicted
from bench.spec.schema import BenchConfig, ConfigError, Plan, setting

FITS, TIGHT, NO_FIT, UNKNOWN = "fits", "tight", "does not fit", "unknown"
ORDER = {FITS: 0, TIGHT: 1, UNKNOWN: 2, NO_FIT: 3}  # a tight or over-budget layout never ranks above one that fits


@dataclass
class Row:
    """A planned candidate: what it changes, its plan and what the plan says."""

    strategy: str
    changes: dict
    plan: Plan
    memory: dict
    verdict: str
    prediction: Optional[dict] = None
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> Optional[float]:
        return self.prediction["tokens_per_s"] if self.prediction else None

    def rank_key(self) -> tuple:
        """Fits before tight before does-not-fit; the fastest first; among those that do not fit (no prediction),
        the closest to fitting first."""
        return ORDER[self.verdict], -(self.tokens_per_s or 0.0), self.memory.get("needed_mb") or 0.0


def verdict_of(mem: dict) -> str:
    """The memory plan's verdict as a word: its own ``verdict`` field where it has one, else fits / tight."""
    v = mem.get("verdict")
    if isinstance(v, str) and v in ORDER:
        return v
    if mem.get("fits") is None:
        return UNKNOWN
    if mem.get("fits") is False or mem.get("host_fits") is False:
        return NO_FIT
    return TIGHT if mem.get("tight") else FITS


def set_key(c: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        c = c.setdefault(p, {})
    c[leaf] = value


class Evaluator:
    """Plans candidates, each once (a search tries the same setting from several directions)."""

    def __init__(self, gpus: Optional[int] = None) -> None:
        self.gpus = gpus  # the GPUs a run may use (None: the visible ones; a dry run plans the preset's)
        self.cache: dict[str, Optional[Row]] = {}
        self.invalid: dict[str, str] = {}  # candidate -> why it does not validate
        self.refused: dict[str, str] = {}  # candidate -> the key its refusal names
        self.planned = 0

    def __call__(self, base: dict, changes: dict) -> Optional[Row]:
        key = self._key(base, changes)
        if key not in self.cache:
            self.cache[key] = self._plan(base, changes, key)
        return self.cache[key]

    def refuses(self, base: dict, changes: dict) -> Optional[str]:
        """The key a candidate's refusal names (None: it validates)."""
        self(base, changes)
        return self.refused.get(self._key(base, changes))

    @staticmethod
    def _key(base: dict, changes: dict) -> str:
        return repr((base["strategy"]["name"], id(base), sorted(changes.items(), key=str)))

    def _plan(self, base: dict, changes: dict, key: str) -> Optional[Row]:
        c = copy.deepcopy(base)
        for k, v in changes.items():
            set_key(c, k, v)
        c["dry_run"] = True  # plan a hardware preset on any machine (the command itself does not say dry_run)
        try:
            plan = validate(c, gpus=self.gpus, explicit=list(changes))
        except ConfigError as e:
            self.invalid[key], self.refused[key] = str(e), e.key
            return None
        self.planned += 1
        mem = memory_plan(plan)
        plan.memory = mem
        verdict = verdict_of(mem)
        pred = None if verdict == NO_FIT else predicted(plan)
        return Row(base["strategy"]["name"], dict(changes), plan, mem, verdict, pred)


def error_parts(pred: dict) -> tuple[str, str, str]:
    """The prediction's error statement as ``python -m bench`` prints it after the numbers, in its three parts: where
    the plan's groups live (its topology past the node count, which the planner's header gives), the error measured
    on its case's or link regime's recorded runs, and that of the recorded runs with its layout's features ("" where
    none)."""
    return pred["topology"].split("; ", 1)[-1], case_words(pred), layout_words(pred.get("layout_error"))


def error_statement(parts: tuple[str, str, str]) -> str:
    """The three parts of ``error_parts`` as one statement, as ``python -m bench`` prints it."""
    where, case, layout = parts
    return f"{where}; {case}{layout}"


def mfu(row: Row) -> Optional[float]:
    """Predicted model FLOP utilisation against the GPU's dense peak (fp8: the bf16 peak, as measured MFU is)."""
    from bench.metrics.flops import flops_per_token, mfu_peak_tflops

    if row.tokens_per_s is None:
        return None
    hw = device_hardware(row.plan)
    peak, _ = mfu_peak_tflops(hw.gpu, row.plan.run.precision, bool(row.plan.run.tf32))
    if not peak:
        return None
    return row.tokens_per_s * flops_per_token(row.plan.model) / (row.plan.world_size * peak * 1e12)


def job_cost(row: Row, train_tokens: Optional[float]) -> tuple[Optional[float], Optional[float]]:
    """(days, GPU-hours) to train ``train_tokens`` at the predicted tokens/s on the plan's world size."""
    if not train_tokens or not row.tokens_per_s:
        return None, None
    seconds = train_tokens / row.tokens_per_s
    return seconds / 86400, seconds / 3600 * row.plan.world_size

"""A sweep's jobs: one per combination of the overrides, and what the plan decided for each."""
from __future__ import annotations

import hashlib
import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict

from bench.run.cli_errors import missing_option
from bench.run.config import validate
from bench.planner.resolve import resolved
from bench.plan.memory_model import fits, memory_plan
from bench.metrics import identity
from bench.run.runs import run_key
from bench.spec.commands import override_key
from bench.spec.schema import BenchConfig, ConfigError, Plan
from bench.sweep.cost import CostModel, fmt_s, history_records
from bench.sweep.status_report import NOT_RUN, reason_lines

log = logging.getLogger("bench.sweep")


@dataclass
class Job:
    num: int
    overrides: list[str]
    cfg: Optional[dict] = None  # resolved task config, tuning applied (None: it could not be composed/resolved)
    key: Optional[str] = None
    ident: dict = field(default_factory=dict)
    action: str = "run"  # run | invalid / skipped (recorded without running) | skip (resumed)
    reason: Optional[str] = None
    error: Optional[dict] = None  # pre-check ConfigError (invalid) or predicted OOM (skipped)
    dir: Optional[str] = None  # folder name in the sweep dir
    estimate_s: Optional[float] = None
    memory: Optional[dict] = None  # the memory plan (bench/plan/memory_model.py)
    prediction: Optional[dict] = None  # dry runs: the throughput prediction (bench/plan/predict.py)
    plan: Optional[Plan] = None  # the validated plan (the knob search predicts its trials from it)

    def record(self) -> dict:
        return {"num": self.num, "dir": self.dir, "key": self.key, "action": self.action, "reason": self.reason,
                "overrides": [o for o in self.overrides if not o.startswith("hydra.sweep.subdir=")],
                **self.ident, "estimate_s": self.estimate_s}


def subdir_override(name: str) -> str:
    """The override that runs a job into the run folder ``name``, quoted: unquoted, Hydra's override grammar
    reads ``1_67436339`` (a ``<num>_<key[:8]>`` folder whose key starts with 8 digits) as the int 167436339
    (Python's digit separator) and ``1_6743e339`` as a float (inf): the run went into ``167436339/`` or
    ``inf/`` while the sweep read the pending status of the folder it planned."""
    return f"hydra.sweep.subdir='{name}'"


def expand(parser: OverridesParser, arguments: Sequence[str]) -> list[list[str]]:
    """The cartesian product of a sweep's overrides (``a=1,2 b=x,y``), in Hydra's basic sweeper's order."""
    lists: dict[str, list[str]] = {}
    for o in parser.parse_overrides(list(arguments)):
        key = o.get_key_element()
        if o.is_sweep_override():
            if not o.is_discrete_sweep():
                raise ValueError(f"{o.input_line}: only lists (a=1,2) can be swept, not ranges or intervals")
            lists[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            lists[key] = [f"{key}={o.get_value_element_as_str()}"]
    return [list(x) for x in itertools.product(*lists.values())]



def compose(job: Job, load: Callable[[list[str]], DictConfig], gpus: Callable[[dict], int],
            gpu_memory_gib: Callable[[BenchConfig], Optional[float]]) -> None:
    """Plan one job: its resolved config (``tuning`` applied), run key and memory plan; ``invalid``
    (cannot be composed or validated) or ``skipped`` (predicted not to fit) with the reason."""
    try:
        sc = load(list(job.overrides))
        with open_dict(sc):
            del sc["hydra"]
        job.cfg = OmegaConf.to_container(sc, resolve=True)
    except Exception as e:  # an override or interpolation that cannot be resolved for this job
        job.action = "invalid"  # a group typo (model=lama3_8b) in one line, else Hydra's message on one
        job.reason = missing_option(e) or f"configuration cannot be composed: {' '.join(str(e).split())}"
        job.error = {"rank": None, "type": type(e).__name__, "message": str(e), "traceback": None,
                     "key": None, "value": None}
        job.key = hashlib.sha256(" ".join(job.overrides).encode()).hexdigest()[:16]
        return
    try:
        explicit = [override_key(o) for o in job.overrides]
        # auto / tuning=best resolved as the run itself resolves them (bench/launch/job.py), so both compute one run key
        plan = resolved(validate(dict(job.cfg), gpus=gpus(job.cfg), explicit=explicit), explicit, gpus(job.cfg),
                        f"job {job.num}: {' '.join(job.overrides)}")
    except ConfigError as e:
        job.key, job.ident = run_key(job.cfg), identity(job.cfg)
        job.action, job.reason = "invalid", str(e)
        job.error = {"rank": None, "type": "ConfigError", "message": str(e), "traceback": None,
                     "key": e.key, "value": e.value}
        return
    job.cfg, job.plan = plan.cfg, plan  # the settings that will run (tuning=best applied)
    job.key, job.ident = run_key(job.cfg), identity(job.cfg)
    job.memory = memory_plan(plan, gpu_memory_gib=gpu_memory_gib(plan.run))
    if plan.run.dry_run:  # the answer before any GPU is spent: <sweep>/plans.json
        from bench.plan.prediction_text import predicted

        job.prediction = predicted(plan)
    verdict = fits(job.memory, plan)
    if verdict is not None and not plan.run.force_run:
        job.action, job.reason = "skipped", verdict
        job.error = {"rank": None, "type": "PredictedOOM", "message": verdict, "traceback": None}

def log_plan(jobs: list[Job], to_run: list[Job], sweep_dir: Path, history: Sequence[Path], resume: bool, rerun: bool,
             plan_s: float, dry: bool) -> None:
    """What the sweep will do, with a GPU-time estimate from earlier results in ``history`` folders."""
    model = CostModel(history_records(history))
    for j in to_run:
        j.estimate_s = model.estimate(j.ident)
    n = {a: sum(j.action == a for j in jobs) for a in ("invalid", "skipped", "skip")}
    log.info("[sweep] %d runs in %s: %d to run, %d invalid and %d predicted not to fit (recorded without "
             "running), %d resumed (resume=%s rerun_failed=%s); planned in %.1f s", len(jobs), sweep_dir,
             len(to_run), n["invalid"], n["skipped"], n["skip"], resume, rerun, plan_s)
    known = [j for j in to_run if j.estimate_s is not None]
    if known:
        wall = sum(j.estimate_s for j in known)
        gpu = sum(j.estimate_s * (j.ident.get("world_size") or 1) for j in known)
        log.info("[sweep] estimate from earlier results: %s of GPU time, %s of wall time one run at a time, "
                 "for %d of the %d runs to run%s", fmt_s(gpu), fmt_s(wall), len(known), len(to_run),
                 f" ({len(to_run) - len(known)} without earlier results: not estimated)"
                 if len(known) < len(to_run) else "")
    elif to_run:
        log.info("[sweep] no earlier results of these model/strategy/world sizes: no GPU time estimate")
    for j in jobs:
        if (j.action != "run" or dry) and not (j.action in NOT_RUN and not dry):
            mem = f" | {j.memory['summary']}" if j.memory and dry else ""
            log.info("[sweep]   #%d %s: %s%s%s", j.num, " ".join(j.record()["overrides"]) or "(defaults)",
                     j.action, f" ({j.reason.splitlines()[0]})" if j.reason else "", mem)
    if to_run and not dry:  # invalid / predicted not to fit: each reason once (none to run: the summary says them)
        for line in reason_lines([(j.action, j.num, j.reason) for j in jobs if j.action in NOT_RUN]):
            log.info("%s", line)


def declare_preloads(to_run: list[Job]) -> None:
    """What the fork server should import once for all the runs (bench/launch/local.py), declared before
    the first run starts it: a Megatron run late in a sweep then finds megatron.core imported."""
    from bench.launch.local import preload
    from bench.strategies.registry import sweep_preloads

    forked = [j for j in to_run if j.plan is not None and j.plan.run.start_method == "forkserver"]
    if len(forked) < 2:
        return
    for j in forked:
        preload(sweep_preloads(j.plan.run))


def write_plans(sweep_dir: Path, jobs: Sequence[Job]) -> Path:
    """A dry-run sweep's record: each job's config, memory plan (fit verdict) and prediction, in
    ``<sweep>/plans.json``, for ``python -m multirun_analysis <sweep>`` to rank (marked as predicted)."""
    from bench.jsonio import write_json_atomic

    path = Path(sweep_dir) / "plans.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, [{**j.record(), "config": j.cfg, "memory": j.memory, "prediction": j.prediction}
                             for j in jobs])
    return path

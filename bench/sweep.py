"""Sweeps: the plan of a multirun, resume, run folders, cost guard, progress and the summary.

``hydra/sweeper=bench`` (the default, conf/hydra/sweeper/bench.yaml) is Hydra's basic sweeper
(the same cartesian product of ``a=1,2 b=x,y`` and ``hydra.sweeper.params``) plus, before
anything runs, a plan of every job:

* its resolved configuration and **run key** (:func:`run_key`: a hash of the resolved
  configuration minus :data:`VOLATILE_KEYS`; stored in the run's status.json and metrics.json);
* a pre-check (``bench.config.validate``): a combination that cannot run is recorded right away
  as status ``invalid`` with the reason, and no process (or SLURM job) is started for it;
* with ``resume=true``: a job whose key already has a completed result anywhere in the sweep
  folder is skipped (so are failed/oom/timeout ones unless ``rerun_failed=true``, and invalid
  ones that are still invalid); an interrupted one (Ctrl-C: no result of its configuration) is
  run again;
* its folder: ``<sweep dir>/<job number>`` unless that folder holds a completed result, or a final
  result of another configuration; then ``<number>_<key[:8]>`` (``_2``, ``_3``, ... for repeats).
  A completed result is never written over; a failed attempt that is run again in place is moved
  to ``<folder>/.attempts/<n>/`` first.  The job's folder is passed to Hydra as
  ``hydra.sweep.subdir``, so Hydra's own files (.hydra/, the job log) never touch another result;
* status ``pending`` written into the folder of every job that will run.

Then it prints how many runs the sweep expands to and, where earlier results exist (this sweep
folder, ``<cwd>/multirun`` and ``hydra.sweeper.history``), an estimate of GPU time; launches the
jobs one at a time (local launchers: one benchmark at a time, a live ``run i/N`` line each) or all
at once (``hydra/launcher=slurm``); and stops after a run that ended ``interrupted`` (Ctrl-C).
``hydra.sweeper.dry_run=true`` prints the plan and runs nothing.

Several sweep processes may run on one sweep folder at once (bench/claims.py): each plans holding
the folder's lock and claims each job just before it runs; a run folder claimed by another live
process is never chosen, moved aside or written; with ``resume=true`` a job another process runs
is waited for and one it completed is not run again, so two ``resume=true`` sweeps share the work.

:class:`SweepCallback` (``hydra.callbacks.bench_sweep``) prints the summary at the end of the
multirun, writes ``<sweep dir>/summary.json`` and sets the exit code: 0 when every run completed
or was invalid (a combination that cannot run does not fail a sweep), 130 when the sweep was
interrupted, 1 when any run failed, ran out of memory, timed out or never reported a status.
Progress and summary are plain log lines (no carriage returns), fine in non-interactive logs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from bench import claims
from bench.metrics.io import read_json_dict, write_json_atomic

log = logging.getLogger("bench.sweep")

# Top-level keys that do not change what a run measures: left out of the run key.
VOLATILE_KEYS = ("resume", "rerun_failed", "run_timeout_s", "teardown_timeout_s", "dist_timeout_s", "start_method", "vars", "_command")
FINAL = ("completed", "failed", "oom", "invalid", "timeout", "interrupted")
FAILED = ("failed", "oom", "timeout", "interrupted")  # final, not completed, worth a re-run
MANIFEST = "sweep.json"
SUMMARY = "summary.json"
ATTEMPTS = ".attempts"


# ------------------------------------------------------------------------------ keys and results
# Keys ("key" or "group.key") added after sweeps were first recorded, with the default that does
# what runs did before them: at that default they are left out of the key, so an earlier sweep
# folder still resumes.
ADDED_AT_DEFAULT = {"compile_mode": "default", "strategy.autocast": False, "strategy.leaf_blocks": False,
                    "strategy.deepcompile": False, "strategy.blocks_per_unit": 1,
                    "strategy.compute_grad_norm": True, "cpu_affinity": "none"}


def run_key(cfg: dict) -> str:
    """Hash of a resolved run configuration (plain containers), volatile keys left out."""
    c = {k: v for k, v in cfg.items() if k not in VOLATILE_KEYS}
    for dotted, default in ADDED_AT_DEFAULT.items():
        group, _, leaf = dotted.rpartition(".")
        parent = c.get(group) if group else c
        if isinstance(parent, dict) and leaf in parent and parent[leaf] == default:
            rest = {k: v for k, v in parent.items() if k != leaf}  # a copy: cfg stays as it was
            if group:
                c[group] = rest
            else:
                c = rest
    blob = json.dumps(c, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def with_added_defaults(cfg: dict) -> dict:
    """A recorded run's configuration with the knobs added since, at the defaults that do what it did
    (only the strategy knobs its strategy has): the reading side of run_key's rule, so that an older
    and a newer run of one configuration are one experiment (multirun_analysis)."""
    from bench.config import STRATEGY_SCHEMAS

    out, strategy = dict(cfg), cfg.get("strategy")
    schema = STRATEGY_SCHEMAS.get(strategy.get("name")) if isinstance(strategy, dict) else None
    knobs = {f.name for f in dataclasses.fields(schema)} if schema else set()
    for dotted, default in ADDED_AT_DEFAULT.items():
        group, _, leaf = dotted.rpartition(".")
        if not group:
            out.setdefault(leaf, default)
        elif group == "strategy" and leaf in knobs and leaf not in strategy:
            out["strategy"] = strategy = {**strategy, leaf: default}
    return out


def identity(cfg: dict) -> dict:
    """What the cost estimate and the summary group runs by."""
    m, s = cfg.get("model") or {}, cfg.get("strategy") or {}
    return {"model": m.get("name"), "strategy": s.get("name"), "world_size": cfg.get("world_size"),
            "precision": cfg.get("precision"), "steps": cfg.get("steps")}


@dataclass
class Result:
    dir: Path
    status: Optional[str]  # a FINAL status, pending, running, or None (unknown)
    key: Optional[str]
    info: dict = field(default_factory=dict)  # status.json


def read_result(d: Path) -> Optional[Result]:
    """What a run folder holds (None: no status.json and no metrics.json)."""
    st, m = read_json_dict(d / "status.json"), read_json_dict(d / "metrics.json")
    if st is None and m is None:
        return None
    status = (st or {}).get("status")
    if status not in FINAL and m and m.get("status") in FINAL:
        status = m["status"]  # status.json not updated (killed between the two writes)
    key = (st or {}).get("key") or ((m or {}).get("job") or {}).get("key")
    if key is None and m and isinstance(m.get("config"), dict):
        key = run_key(m["config"])  # results written before run keys existed
    return Result(d, status, key, st or {})


def holds_completed(d: Path) -> bool:
    r = read_result(d) if d.is_dir() else None
    return r is not None and r.status == "completed"


def scan(sweep_dir: Path) -> list[Result]:
    out = []
    if sweep_dir.is_dir():
        for d in sorted(sweep_dir.iterdir()):
            if d.is_dir() and not d.name.startswith("."):
                r = read_result(d)
                if r is not None:
                    out.append(r)
    return out


def move_aside(d: Path) -> Optional[Path]:
    """Move what a folder holds (a failed or stale attempt) into <d>/.attempts/<n>/."""
    items = [p for p in d.iterdir() if p.name != ATTEMPTS] if d.is_dir() else []
    if not items:
        return None
    n = 1
    while (d / ATTEMPTS / str(n)).exists():
        n += 1
    dest = d / ATTEMPTS / str(n)
    dest.mkdir(parents=True)
    for p in items:
        shutil.move(str(p), str(dest / p.name))
    return dest


# ------------------------------------------------------------------------------ cost estimate
def _history_records(dirs: Sequence[Path]) -> list[dict]:
    recs, seen = [], set()
    for root in dirs:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [x for x in dirnames if not x.startswith(".")]
            depth = len(Path(dirpath).relative_to(root).parts)
            if depth >= 4:
                dirnames[:] = []
            if "status.json" in filenames:
                p = Path(dirpath).resolve()
                if p in seen:
                    continue
                seen.add(p)
                st = read_json_dict(p / "status.json")
                if st and st.get("status") == "completed" and st.get("wall_s"):
                    recs.append(st)
    return recs


class CostModel:
    """wall(run) ~ fixed overhead + steps x time per step, medians over completed runs with the
    same model / strategy / world size (and precision, when there are such runs)."""

    def __init__(self, records: list[dict]):
        self.by: dict[tuple, list[dict]] = {}
        for r in records:
            for k in (self._k(r, True), self._k(r, False)):
                self.by.setdefault(k, []).append(r)

    @staticmethod
    def _k(r: dict, precise: bool) -> tuple:
        base = (r.get("model"), r.get("strategy"), r.get("world_size"))
        return base + ((r.get("precision"),) if precise else ())

    def estimate(self, ident: dict) -> Optional[float]:
        rs = self.by.get(self._k(ident, True)) or self.by.get(self._k(ident, False))
        if not rs:
            return None
        over = statistics.median(r.get("overhead_s") or 0.0 for r in rs)
        per_step = statistics.median(max(0.0, r["wall_s"] - (r.get("overhead_s") or 0.0)) / max(1, r.get("steps") or 1)
                                     for r in rs)
        return over + per_step * (ident.get("steps") or 1)


def _fmt_s(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else (f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s")


# ------------------------------------------------------------------------------ the sweeper
@dataclass
class Job:
    num: int
    overrides: list[str]
    cfg: Optional[dict] = None  # resolved task config (None: it could not be composed/resolved)
    key: Optional[str] = None
    ident: dict = field(default_factory=dict)
    action: str = "run"  # run | invalid (recorded without running) | skip
    reason: Optional[str] = None
    error: Optional[dict] = None  # pre-check ConfigError, for invalid
    dir: Optional[str] = None  # folder name in the sweep dir
    estimate_s: Optional[float] = None

    def record(self) -> dict:
        return {"num": self.num, "dir": self.dir, "key": self.key, "action": self.action, "reason": self.reason,
                "overrides": [o for o in self.overrides if not o.startswith("hydra.sweep.subdir=")],
                **self.ident, "estimate_s": self.estimate_s}


_STATE: dict[str, Any] = {}  # what the callback needs from the sweeper (same process)


class BenchSweeper(BasicSweeper):
    """Hydra's basic sweeper with the plan described in the module docstring."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict] = None,
                 dry_run: bool = False, sequential: Optional[bool] = None,
                 history: Optional[list] = None) -> None:
        # (not super().__init__: Hydra's plugin scan re-executes basic_sweeper, whose __init__ calls
        # super(BasicSweeper, self) with the re-created class; its body is these attributes)
        self.overrides = None
        self.batch_index = 0
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.hydra_context = None
        self.config = None
        self.launcher = None
        self.dry_run = dry_run
        self.sequential = sequential  # None: one at a time unless the launcher runs jobs in parallel
        self.history = list(history or [])
        self._busy: set[str] = set()  # run folders claimed by other live sweep processes (bench/claims.py)
        self._jobs: list = []

    # -- planning
    def _expand(self, arguments: list[str]) -> list[list[str]]:
        params_conf = self._parse_config() + list(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides(params_conf)
        return self.split_arguments(overrides, None)[0]

    def _compose(self, job: Job) -> None:
        from bench.config import ConfigError, validate

        try:
            sc = self.hydra_context.config_loader.load_sweep_config(self.config, list(job.overrides))
            with open_dict(sc):
                del sc["hydra"]
            job.cfg = OmegaConf.to_container(sc, resolve=True)
        except Exception as e:  # an override or interpolation that cannot be resolved for this job
            job.action, job.reason = "invalid", f"configuration cannot be composed: {' '.join(str(e).split())}"
            job.error = {"rank": None, "type": type(e).__name__, "message": str(e), "traceback": None,
                         "key": None, "value": None}
            job.key = hashlib.sha256(" ".join(job.overrides).encode()).hexdigest()[:16]
            return
        job.key, job.ident = run_key(job.cfg), identity(job.cfg)
        try:
            validate(dict(job.cfg), gpus=self._gpus_for(job.cfg))
        except ConfigError as e:
            job.action, job.reason = "invalid", str(e)
            job.error = {"rank": None, "type": "ConfigError", "message": str(e), "traceback": None,
                         "key": e.key, "value": e.value}

    def _gpus_for(self, cfg: dict) -> int:
        fn = getattr(self.launcher, "precheck_gpus", None)
        if fn is not None:
            return fn(cfg)
        if "gpus" not in _STATE:
            from bench.config import cuda_device_count

            _STATE["gpus"] = cuda_device_count()
        return _STATE["gpus"]

    def _decide(self, job: Job, results: list[Result], taken: set[str], resume: bool, rerun: bool) -> None:
        same = [r for r in results if r.key == job.key]
        if resume:
            done = [r for r in same if r.status == "completed"]
            # stopped by Ctrl-C: no result of its configuration, so resume=true runs it again
            stopped = [r for r in same if r.status == "interrupted"]
            failed = [r for r in same if r.status in FAILED and r.status != "interrupted"]
            invalid = [r for r in same if r.status == "invalid"]
            if done:
                job.action, job.dir, job.reason = "skip", done[0].dir.name, f"completed earlier in {done[0].dir.name}/"
                return
            if failed and not rerun:
                job.action, job.dir = "skip", failed[0].dir.name
                job.reason = f"{failed[0].status} earlier in {failed[0].dir.name}/ (rerun_failed=true runs it again)"
                return
            if invalid and job.action == "invalid":
                job.action, job.dir, job.reason = "skip", invalid[0].dir.name, f"still invalid: {job.reason}"
                return
            if failed or stopped:  # rerun_failed / interrupted: run it again in the folder of its attempt
                again = failed + stopped
                job.reason = f"{again[0].status} earlier in {again[0].dir.name}/: running it again"
                job.dir = self._folder(job, taken, prefer=[r.dir.name for r in again])
                return
        job.dir = self._folder(job, taken)

    def _folder(self, job: Job, taken: set[str], prefer: Sequence[str] = ()) -> str:
        base = str(job.num)
        names = [*prefer, base, f"{base}_{job.key[:8]}"] + [f"{base}_{job.key[:8]}_{i}" for i in range(2, 10_000)]
        for name in names:
            if name in taken or name in self._busy:  # _busy: claimed by another live process (bench/claims.py)
                continue
            d = self.sweep_dir / name
            r = read_result(d) if d.is_dir() else None
            if r is None or r.status not in FINAL:  # empty, or a stale pending/running attempt
                return name
            if r.status != "completed" and r.key == job.key:  # this configuration's failed/invalid attempt
                return name
        raise RuntimeError(f"no free folder for job {job.num} in {self.sweep_dir}")

    def _prepare(self, job: Job, resume: bool, rerun: bool) -> None:
        """Write what a planned job's folder shows before it runs."""
        from bench import metrics

        d = self.sweep_dir / job.dir
        old = read_result(d) if d.is_dir() else None
        rerecord = job.action == "invalid" and old is not None and old.status == "invalid"  # nothing to keep
        # a pending status and nothing else (planned by a sweep, never started) is no attempt to keep
        rerecord |= old is not None and old.status == "pending" and \
            [p.name for p in d.iterdir() if p.name != ATTEMPTS] == ["status.json"]
        if d.is_dir() and not rerecord and any(p.name != ATTEMPTS for p in d.iterdir()):
            dest = move_aside(d)
            log.info("[sweep] job #%d: earlier attempt in %s/ moved to %s", job.num, job.dir,
                     dest.relative_to(self.sweep_dir))
        d.mkdir(parents=True, exist_ok=True)
        base = {"key": job.key, **job.ident, "overrides": job.record()["overrides"], "time": time.time(),
                "sweep": claims.owner()}  # the sweep process that planned it (bench/claims.py)
        if job.action == "invalid":
            m = metrics.skeleton(job.cfg or {}, "invalid", job.error)
            m["job"] = {"key": job.key, "wall_s": 0.0, "startup_s": None, "teardown_s": None, "overhead_s": None,
                        "recorded_by": "sweep pre-check (no process started)"}
            write_json_atomic(d / "metrics.json", m)
            write_json_atomic(d / "status.json", {"status": "invalid", **base, "reason": job.reason, "wall_s": 0.0})
        else:
            write_json_atomic(d / "status.json", {"status": "pending", **base})

    # -- the sweep
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        t_plan = time.time()
        self.sweep_dir = Path(str(self.config.hydra.sweep.dir))
        expanded = self._expand(arguments)
        jobs = [Job(num=i, overrides=list(o)) for i, o in enumerate(expanded)]
        resume = bool(OmegaConf.select(self.config, "resume", default=False))
        rerun = bool(OmegaConf.select(self.config, "rerun_failed", default=False))
        # the plan is made and written holding the sweep folder's lock, against the run folders other
        # live sweep processes have claimed (bench/claims.py); a dry run writes nothing, locks nothing
        self._t_plan, self._resume, self._rerun = t_plan, resume, rerun
        plan_lock = contextlib.nullcontext() if self.dry_run else claims.locked(self.sweep_dir)
        with plan_lock:
            self._busy = {name for name, c in claims.live_claims(self.sweep_dir, prune=not self.dry_run).items()
                          if not claims.is_me(c.get("owner"))}
            results = scan(self.sweep_dir)
            taken: set[str] = set()
            for job in jobs:
                self._compose(job)
                self._decide(job, results, taken, resume, rerun)
                if job.action != "skip":
                    taken.add(job.dir)
            # cost guard
            cwd = Path(str(OmegaConf.select(self.config, "hydra.runtime.cwd", default=os.getcwd())))
            hist_dirs = [self.sweep_dir, cwd / "multirun", *[Path(str(h)) for h in self.history]]
            model = CostModel(_history_records(hist_dirs))
            to_run = [j for j in jobs if j.action == "run"]
            for j in to_run:
                j.estimate_s = model.estimate(j.ident)
            n_inv = sum(j.action == "invalid" for j in jobs)
            n_skip = sum(j.action == "skip" for j in jobs)
            log.info("[sweep] %d runs in %s: %d to run, %d invalid (recorded without running), %d skipped "
                     "(resume=%s rerun_failed=%s); planned in %.1f s", len(jobs), self.sweep_dir, len(to_run), n_inv,
                     n_skip, resume, rerun, time.time() - t_plan)
            known = [j for j in to_run if j.estimate_s is not None]
            if known:
                wall = sum(j.estimate_s for j in known)
                gpu = sum(j.estimate_s * (j.ident.get("world_size") or 1) for j in known)
                log.info("[sweep] estimate from earlier results: %s of GPU time, %s of wall time one run at a time, "
                         "for %d of the %d runs to run%s", _fmt_s(gpu), _fmt_s(wall), len(known), len(to_run),
                         f" ({len(to_run) - len(known)} without earlier results: not estimated)"
                         if len(known) < len(to_run) else "")
            elif to_run:
                log.info("[sweep] no earlier results of these model/strategy/world sizes: no GPU time estimate")
            for j in jobs:
                if j.action != "run" or self.dry_run:
                    log.info("[sweep]   #%d %s: %s%s", j.num, " ".join(j.record()["overrides"]) or "(defaults)",
                             j.action, f" ({j.reason.splitlines()[0]})" if j.reason else "")
            _STATE.update(sweep_dir=self.sweep_dir, dry_run=self.dry_run, interrupted=False)
            if self.dry_run:
                log.info("[sweep] dry run: nothing written, nothing run")
                return []

            OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
            for j in jobs:
                if j.action != "skip":
                    self._prepare(j, resume, rerun)
            manifest = {"started": time.time(), "sweep_dir": str(self.sweep_dir), "argv": sys.argv,
                        "resume": resume, "rerun_failed": rerun, "launcher": type(self.launcher).__name__,
                        "jobs": [j.record() for j in jobs]}
            write_json_atomic(self.sweep_dir / MANIFEST, manifest)
            _STATE["manifest"] = manifest
            self._jobs = jobs

        for j in to_run:
            j.overrides = list(j.overrides) + [f"hydra.sweep.subdir={j.dir}"]
        _declare_preloads(to_run)
        sequential = self.sequential
        if sequential is None:
            sequential = not getattr(self.launcher, "parallel_jobs", False)
        if not to_run:
            return []
        if sequential:
            return self._run_sequential(to_run)
        return self._run_parallel(to_run)

    def _counts(self, upto: list[Job]) -> str:
        c: dict[str, int] = {}
        for j in upto:
            r = read_result(self.sweep_dir / j.dir)
            s = r.status if r else "unknown"
            c[s] = c.get(s, 0) + 1
        return ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or "none yet"

    # -- claims: several sweep processes on one sweep folder (bench/claims.py)
    def _claim(self, j: Job) -> str:
        """Claim job j just before it runs: "run" (claimed, into j.dir), "done" (with resume=true:
        another sweep completed it, or ran it since this one planned: it is not run twice) or "busy"
        (with resume=true: another live sweep process runs it now; wait for it)."""
        with claims.locked(self.sweep_dir):
            others = {name: c for name, c in claims.live_claims(self.sweep_dir).items()
                      if not claims.is_me(c.get("owner"))}
            self._busy = set(others)
            if self._resume:
                held = [name for name, c in others.items() if c.get("key") == j.key]
                if held:
                    j.reason = f"being run by another sweep (pid {others[held[0]]['owner'].get('pid')}) in {held[0]}/"
                    return "busy"
                same = [r for r in scan(self.sweep_dir) if r.key == j.key]
                done = [r for r in same if r.status == "completed"] or \
                    [r for r in same if r.status in FINAL and (r.info.get("time") or 0) > self._t_plan]
                if done:
                    self._leave(j.dir)
                    j.action, j.dir = "skip", done[0].dir.name
                    j.reason = f"{done[0].status} by another sweep in {done[0].dir.name}/"
                    self._rewrite_manifest()
                    return "done"
            st = read_json_dict(self.sweep_dir / j.dir / "status.json") or {}
            if j.dir in others or not (st.get("status") == "pending" and claims.is_me(st.get("sweep"))):
                # another sweep process took the folder planned for it: choose again
                old = j.dir
                planned = {x.dir for x in self._jobs if x is not j and x.action != "skip" and x.dir}
                j.dir = self._folder(j, planned)
                self._prepare(j, self._resume, self._rerun)
                j.overrides = [o for o in j.overrides if not o.startswith("hydra.sweep.subdir=")] + \
                    [f"hydra.sweep.subdir={j.dir}"]
                log.info("[sweep] job #%d: %s/ was taken by another sweep process: runs into %s/", j.num, old, j.dir)
                self._rewrite_manifest()
            claims.claim(self.sweep_dir, j.dir, j.key)
            return "run"

    def _leave(self, name: Optional[str]) -> None:
        """Remove the pending status this process planned into a folder it will not run into."""
        if not name:
            return
        d = self.sweep_dir / name
        st = read_json_dict(d / "status.json") or {}
        if st.get("status") == "pending" and claims.is_me(st.get("sweep")):
            (d / "status.json").unlink(missing_ok=True)
            try:
                d.rmdir()
            except OSError:
                pass

    def _rewrite_manifest(self) -> None:
        man = _STATE.get("manifest")
        if man is not None:
            man["jobs"] = [x.record() for x in self._jobs]
            write_json_atomic(self.sweep_dir / MANIFEST, man)

    def _next(self, queue: list[Job], waiting: set[int]) -> Optional[Job]:
        """The first job of the queue this process claims (None: every one left is run by another sweep)."""
        for cand in list(queue):
            got = self._claim(cand)
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

    def _run_sequential(self, to_run: list[Job]) -> list:
        returns = []
        queue, waiting = list(to_run), set()
        while queue:
            try:
                j = self._next(queue, waiting)
                if j is None:
                    if queue:
                        time.sleep(1.0)
                    continue
            except KeyboardInterrupt:
                _STATE["interrupted"] = True
                log.error("[sweep] interrupted while waiting for another sweep's runs: stopping the sweep")
                break
            i = to_run.index(j)
            try:
                est = f", estimate {_fmt_s(j.estimate_s)}" if j.estimate_s is not None else ""
                log.info("[sweep] run %d/%d (job #%d -> %s/): %s%s | so far: %s", i + 1, len(to_run), j.num, j.dir,
                         " ".join(j.record()["overrides"]), est, self._counts(to_run[:i]))
                t0 = time.time()
                try:
                    returns.append(self.launcher.launch([j.overrides], initial_job_idx=j.num))
                except KeyboardInterrupt:
                    mark_interrupted(self.sweep_dir / j.dir, j.cfg, "Ctrl-C (KeyboardInterrupt) in the sweep process")
                    _STATE["interrupted"] = True
                    log.error("[sweep] interrupted during run %d/%d: stopping the sweep", i + 1, len(to_run))
                    break
                ret = returns[-1][0] if returns[-1] else None
                if ret is not None and ret.status == JobStatus.FAILED:  # the task function itself raised
                    e = ret._return_value
                    log.error("[sweep] job #%d raised %s: %s", j.num, type(e).__name__, e, exc_info=e)
                    mark_unfinished(self.sweep_dir / j.dir, j.cfg, "failed", type(e).__name__,
                                    f"the job raised {type(e).__name__}: {e}")
                r = read_result(self.sweep_dir / j.dir)
                status = r.status if r else "unknown"
                log.info("[sweep] run %d/%d (job #%d) ended %s in %.1f s", i + 1, len(to_run), j.num, status,
                         time.time() - t0)
                if status == "interrupted":
                    _STATE["interrupted"] = True
                    log.error("[sweep] run %d/%d was interrupted: stopping the sweep (%d runs not started; "
                              "resume=true continues it)", i + 1, len(to_run), len(queue))
                    break
            finally:
                claims.release(self.sweep_dir, j.dir)
        return returns

    def _run_parallel(self, to_run: list[Job]) -> list:
        claimed = []
        for j in to_run:  # another sweep process's runs are not submitted again (not waited for either)
            if self._claim(j) == "run":
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
            _STATE["interrupted"] = True
            for j in claimed:
                mark_interrupted(self.sweep_dir / j.dir, j.cfg, "Ctrl-C in the sweep process: job cancelled")
            log.error("[sweep] interrupted: submitted jobs cancelled")
            return []
        finally:
            for j in claimed:
                claims.release(self.sweep_dir, j.dir)


def _declare_preloads(to_run: list[Job]) -> None:
    """What the fork server should import once for all the runs (bench/launch.py), declared before
    the first run starts it: a Megatron run late in a sweep then finds megatron.core imported."""
    from bench.launch import preload
    from bench.strategies.base import sweep_preloads

    forked = [j for j in to_run if j.cfg and j.cfg.get("start_method") == "forkserver"]
    if len(forked) < 2:
        return
    for j in forked:
        preload(sweep_preloads(j.cfg["strategy"]))


def mark_interrupted(d: Path, cfg: Optional[dict], message: str) -> None:
    """A run that did not reach a final status because the sweep was stopped."""
    mark_unfinished(d, cfg, "interrupted", "KeyboardInterrupt", message)


def mark_unfinished(d: Path, cfg: Optional[dict], status: str, err_type: str, message: str) -> None:
    """Give a run that ended without recording a final status one (with the reason)."""
    from bench import metrics

    r = read_result(d)
    if r is not None and r.status in FINAL:
        return
    err = {"rank": None, "type": err_type, "message": message, "traceback": None}
    info = (r.info if r else {}) or {}
    m = metrics.skeleton(cfg or {}, status, err)
    m["job"] = {"key": info.get("key")}
    write_json_atomic(d / "metrics.json", m)
    write_json_atomic(d / "status.json", {**info, "status": status, "reason": message, "time": time.time()})


# ------------------------------------------------------------------------------ summary + exit code
def summarize(sweep_dir: Path, manifest: Optional[dict] = None) -> dict:
    """Counts and per-run lines of a sweep folder (the manifest's jobs - ``manifest``, this sweep's own
    plan, else the folder's sweep.json, which another sweep process may have written since -; else
    every run folder)."""
    man = manifest or read_json_dict(sweep_dir / MANIFEST)
    rows = []
    if man:
        for j in man["jobs"]:
            r = read_result(sweep_dir / j["dir"]) if j.get("dir") else None
            status = r.status if r else "unknown"
            rows.append({**j, "status": status, "resumed": j["action"] == "skip",
                         "wall_s": (r.info.get("wall_s") if r else None),
                         "overhead_s": (r.info.get("overhead_s") if r else None),
                         "reason": (r.info.get("reason") if r and r.info.get("reason") else j.get("reason"))})
    else:
        for r in scan(sweep_dir):
            rows.append({"num": None, "dir": r.dir.name, "key": r.key, "action": "run", "status": r.status,
                         "resumed": False, **{k: r.info.get(k) for k in ("model", "strategy", "world_size",
                                                                         "wall_s", "overhead_s", "reason")}})
    counts = {s: 0 for s in ("completed", "invalid", "failed", "oom", "timeout", "interrupted", "pending",
                             "unknown")}
    for row in rows:
        # pending: never started (the sweep stopped); running/None: started but never reported its end
        counts[row["status"] if row["status"] in counts else "unknown"] += 1
    resumed = sum(r["resumed"] for r in rows)
    return {"sweep_dir": str(sweep_dir), "runs": len(rows), "counts": counts, "resumed": resumed, "rows": rows}


def exit_code_of(summary: dict, interrupted: bool) -> int:
    c = summary["counts"]
    if interrupted or c["interrupted"]:
        return 130
    if c["failed"] or c["oom"] or c["timeout"] or c["unknown"]:
        return 1
    return 0


def format_summary(s: dict, code: int) -> list[str]:
    c = s["counts"]
    lines = [f"[sweep] SUMMARY {s['runs']} runs: completed={c['completed']} invalid={c['invalid']} "
             f"failed={c['failed']} oom={c['oom']} timeout={c['timeout']} interrupted={c['interrupted']} "
             f"not_run={c['pending']} unknown={c['unknown']} (resumed={s['resumed']}, skipped as invalid="
             f"{c['invalid']}) exit={code}"]
    for r in s["rows"]:
        ident = f"{r.get('model')}/{r.get('strategy')} ws={r.get('world_size')}"
        wall = f" {r['wall_s']:.1f} s" if r.get("wall_s") else ""
        over = f" (overhead {r['overhead_s']:.1f} s)" if r.get("overhead_s") else ""
        why = ""
        if r["status"] not in ("completed",) and r.get("reason"):
            why = " - " + str(r["reason"]).splitlines()[0][:160]
        tag = " [resumed]" if r["resumed"] else ""
        lines.append(f"[sweep]   #{r.get('num')} {r.get('dir')}/ {r['status']:<11} {ident}{wall}{over}{tag}{why}")
    lines.append(f"[sweep] results in {s['sweep_dir']}")
    return lines


class SweepCallback(Callback):
    """Summary and exit code of a multirun (registered in conf/config.yaml, hydra.callbacks)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if _STATE.get("dry_run"):
            return
        sweep_dir = Path(str(_STATE.get("sweep_dir") or config.hydra.sweep.dir))
        s = summarize(sweep_dir, _STATE.get("manifest"))
        code = exit_code_of(s, bool(_STATE.get("interrupted")))
        s["exit_code"] = code
        write_json_atomic(sweep_dir / SUMMARY, {k: v for k, v in s.items()})
        for line in format_summary(s, code):
            log.info(line)
        sys.stdout.flush()
        if code:
            raise SystemExit(code)

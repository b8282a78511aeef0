"""The knob search: ``python -m bench --multirun +experiment=tune model=300m world_size=2 strategy=zero,fsdp``.

``hydra/sweeper=knob_search`` (conf/hydra/sweeper/knob_search.yaml, :class:`KnobSearchSweeper`; what
``+experiment=tune`` sets) is bench's sweeper (the same plan, run keys,
invalid / predicted-OOM records, resume) running successive halving for every configuration the
command line expands to (a *base*: one strategy, model, world size, ...):

* bases: a key that is part of a strategy's identity rather than a knob (``StrategySpec.search_bases``: ZeRO's
  stage; ZeRO-1 and ZeRO-3 are two strategies to the analysis and the store of measured bests) and that the
  command line leaves unset is searched at each of its values, each value a base of its own (its own trials and
  winner), so that ``strategy=zero`` searches ZeRO-0 to ZeRO-3; a value the command line sets is kept;
* candidates: the base at its defaults, the base with ``tuning=best`` (the strategy's profile, where it
  changes something for this base), and every setting one knob away from that profile, over the
  candidate values each knob declares in its schema (``knob(..., tune=(...))``; a knob the command
  line sets is not searched).  Candidates that
  compose to the same run key are one; those that cannot run are recorded ``invalid`` with the reason;
* where there is a GPU to predict for (bench/plan/predict.py), rung 0 runs the default first and the others in
  order of predicted tokens/s, and does not run those predicted below ``DROP_BELOW`` (70%) of the best
  predicted (tune.json names them, with the prediction);
* rung 0 runs every candidate for ``rungs[0]`` = (warm-up, timed) steps; each later rung runs the best
  ``keep`` fraction of the previous one's (by tokens per median step) for its own, longer, steps; the
  last rung runs each survivor ``repeats`` times (seed, seed + 1, ...: repeats of one setting, as the
  analysis counts them) and the winner is the fastest by their median tokens/s, because one short run
  of a host-bound setting can be off by far more than the differences a search is after
  (results/2026-11-25-h100-search-1gpu);
* it stops starting runs once the runs of this sweep folder have used ``budget_min`` GPU-minutes
  (wall time x world size; it must be > 0): the rest stay ``pending``, with the reason;
* ``resume=true`` in the same sweep folder reuses every completed trial (an interrupted search goes on
  where it stopped); the ranking reads the trials' metrics.json.

It writes ``<sweep dir>/tune.json``: per base, every trial (rung, settings, status, its measurement per
rung) and the winner (:func:`winner`) as the ``python -m bench ...`` command line that runs it once;
multirun_analysis reports default vs best.  The winners also go into the user's store of measured bests
(bench/plan/bests.py), where ``tuning=best`` finds them for the nearest workload on the same device type.
Why not Hydra's Optuna sweeper: its trials would bypass bench's plan (run keys, resume, recorded
invalid and skipped runs), and a grid this small is searched exhaustively at rung 0 anyway.
"""
from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

from bench.plan.bests import winner
from bench.jsonio import read_json_dict, write_json_atomic
from bench.strategies.registry import get_spec, specs
from bench.run.runs import read_result, scan
from bench.spec.commands import override_key, rerun_command
from bench.spec.schema import BenchConfig, ConfigError, fields_of
from bench.sweep.jobs import Job
from bench.sweep.sweeper import BenchSweeper

RESULT = "tune.json"
# rung 0 does not measure a candidate predicted below this fraction of the best predicted one: only candidates the
# prediction ranks further behind than its 90th-percentile error (bench/plan/calibration.json "error", printed by
# python -m bench.calibrate) are dropped
DROP_BELOW = 0.7
log = logging.getLogger("bench.sweep")


def tunables(cfg: dict, fixed: set[str]) -> list[tuple[str, tuple, dict]]:
    """(dotted key, candidate values, the settings a candidate needs) of the knobs a search varies for
    this strategy: not those the command line sets, nor those whose needed settings it sets otherwise."""
    spec = get_spec(cfg["strategy"]["name"])
    fields = [("", f) for f in fields_of(BenchConfig).values()] + \
        [("strategy.", f) for f in fields_of(spec.schema).values()]
    out = []
    for prefix, f in fields:
        key, needs = prefix + f.name, f.metadata.get("requires") or {}
        if not f.metadata.get("tune") or key in fixed:
            continue
        if any(k in fixed and _get(cfg, k) != v for k, v in needs.items()):
            continue  # e.g. compile_mode when the command line says compile=false
        out.append((key, f.metadata["tune"], needs))
    return out


def _get(cfg: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else None
    return cfg


def set_keys(overrides: list[str]) -> set[str]:
    """The dotted keys overrides set, a top-level shorthand (``zero_stage=3``) also as the key it sets."""
    keys = {override_key(o) for o in overrides}
    aliases = {n: f.metadata["alias"] for n, f in fields_of(BenchConfig).items() if f.metadata.get("alias")}
    return keys | {aliases[k] for k in keys if k in aliases}


def per_identity(base: list[str], cfg: Optional[dict]) -> tuple[list[list[str]], dict[str, tuple]]:
    """(bases, what was expanded): ``base`` once per value of each key its strategy searches as bases of their
    own (StrategySpec.search_bases) that the base leaves unset; as it is where it sets them all (or does not
    compose: ``cfg`` None)."""
    spec = specs().get(((cfg or {}).get("strategy") or {}).get("name"))
    fixed = set_keys(base)
    grid = {k: tuple(v) for k, v in (spec.search_bases if spec else {}).items() if k not in fixed}
    combos = itertools.product(*([f"{k}={_fmt(x)}" for x in v] for k, v in grid.items()))
    return [list(base) + list(c) for c in combos], grid


def identity_bases(bases: list[list[str]], composed: Callable[[list[str]], Optional[dict]]) -> list[list[str]]:
    """The command line's bases, each strategy identity a search base of its own (:func:`per_identity`; ``composed``
    gives a base's resolved config), with one log line naming the bases expanded."""
    out, expanded = [], []
    for base in bases:
        more, grid = per_identity(base, composed(base))
        out += more
        if grid:
            expanded.append(f"{_words(base)} -> {len(more)} bases, "
                            + " ".join(f"{k}={','.join(map(_fmt, v))}" for k, v in grid.items()))
    if expanded:
        log.info("[tune] searched as bases of their own (a strategy identity each, StrategySpec.search_bases; set "
                 "the key on the command line to search one): %s", "; ".join(expanded))
    return out


def _words(base: list[str]) -> str:
    return " ".join(o for o in base if not o.startswith("+experiment"))


def _untuned(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "tuning"}


def _budget(budget_min: Any) -> float:
    """budget_min as a number of GPU-minutes, refused before any run unless > 0: with none the search
    would leave every trial pending and exit 0."""
    try:
        budget = float(budget_min)
    except (TypeError, ValueError):
        budget = math.nan
    if not budget > 0:
        raise ConfigError("hydra.sweeper.budget_min", budget_min,
                          "must be > 0 GPU-minutes (wall time x world size the search may use; the default is 15)")
    return budget


def _fmt(v: Any) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


class KnobSearchSweeper(BenchSweeper):
    """Successive halving over each base configuration's knobs (module docstring)."""

    def __init__(self, budget_min: float = 15.0, rungs: Optional[list] = None, keep: float = 1 / 3,
                 repeats: int = 1, **kw) -> None:
        super().__init__(**kw)
        self.budget_min = _budget(budget_min)
        self.rungs = [tuple(r) for r in (rungs or [[4, 6], [4, 18]])]
        timed = [r[1] for r in self.rungs]
        if any(b <= a for a, b in zip(timed, timed[1:])):
            raise ConfigError("hydra.sweeper.rungs", [list(r) for r in self.rungs],
                              "each rung's timed steps (its second number) must exceed the rung before: the winner "
                              "and the report compare settings at their longest measurement")
        self.keep = float(keep)
        self.repeats = max(1, int(repeats))
        self._live: Optional[tuple[list[dict], int]] = None  # (state, rung) while a rung runs (run_ended)

    # -- budget
    def spent_min(self) -> float:
        """GPU-minutes the runs in this sweep folder have used (wall time x world size)."""
        total = 0.0
        for r in scan(self.sweep_dir):
            if r.info.get("wall_s"):
                total += r.info["wall_s"] * (r.info.get("world_size") or 1)
        return total / 60

    def over_budget(self) -> Optional[str]:
        spent = self.spent_min()
        return f"the search's budget is spent ({spent:.1f} of hydra.sweeper.budget_min={self.budget_min:g} GPU-minutes)" \
            if spent >= self.budget_min else None

    # -- candidates
    def _composed(self, overrides: list[str]) -> Optional[dict]:
        """The resolved config of overrides (None: it cannot be composed)."""
        probe = Job(num=-1, overrides=list(overrides))
        self._compose(probe)
        return probe.cfg

    def _candidates(self, base: list[str]) -> list[tuple[str, list[str]]]:
        cfg = self._composed(base)
        if cfg is None:
            return [("default", base)]
        fixed = set_keys(base)
        out = [("default", base)]
        with_profile = base + ["tuning=best"]
        best = self._composed(with_profile)
        # the profile as a candidate where it changes something here (on several ranks, DDP's applies nothing)
        changes = best is not None and _untuned(best) != _untuned(cfg)
        if changes:
            out.append(("best", with_profile))
        anchor = with_profile if changes else base
        for key, values, needs in tunables(cfg, fixed):
            for v in values:
                extra = [f"{k}={_fmt(x)}" for k, x in needs.items() if _get(cfg, k) != x]
                out.append((f"{key}={_fmt(v)}", anchor + extra + [f"{key}={_fmt(v)}"]))
        return out

    def _rung_overrides(self, overrides: list[str], rung: int, repeat: int = 0) -> list[str]:
        """A trial's overrides at a rung; repeat i > 0 of the last rung runs with the seed + i (the analysis
        counts runs that differ only in their seed as repeats of one setting)."""
        warm, timed = self.rungs[rung]
        out = [o for o in overrides if override_key(o) not in ("steps", "warmup_steps")] + \
            [f"warmup_steps={warm}", f"steps={warm + timed}"]
        if repeat:
            seed = next((int(o.split("=", 1)[1]) for o in overrides if override_key(o) == "seed"), 0)
            out = [o for o in out if override_key(o) != "seed"] + [f"seed={seed + repeat}"]
        return out

    def _repeats(self, rung: int) -> int:
        return self.repeats if rung == len(self.rungs) - 1 and rung > 0 else 1

    # -- the search
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        self._begin()
        bases = identity_bases(self._expand(arguments), self._composed)
        self._taken, num = set(), 0
        state = []
        for base in bases:
            trials = [{"name": name, "overrides": ov, "rung": -1} for name, ov in self._candidates(base)]
            state.append({"base": base, "trials": trials, "seen": set()})
        for rung in range(len(self.rungs)):
            per_base: list[list[Job]] = []
            n = self._repeats(rung)
            for st in state:
                per_base.append(jobs := [])
                alive = [t for t in st["trials"] if t["rung"] == rung - 1 and t.get("promoted", rung == 0)]
                planned = self.plan([self._rung_overrides(t["overrides"], rung, i) for t in alive for i in range(n)],
                                    first_num=num)
                num += len(planned)
                for t, runs in zip(alive, (planned[k:k + n] for k in range(0, len(planned), n))):
                    j = runs[0]
                    if rung == 0 and j.key in st["seen"]:  # the same run as an earlier candidate
                        t["duplicate_of"] = next(x["name"] for x in st["trials"] if x.get("key") == j.key)
                        continue
                    st["seen"].add(j.key)
                    t.update(rung=rung, key=j.key, jobs=runs)
                    jobs.extend(runs)
                if rung == 0:
                    jobs[:] = by_prediction(st)
            # round-robin over the bases (every default, then every best, then the variants): a budget
            # that runs out cuts every strategy's search short, not the last strategies' whole search
            jobs = [j for group in itertools.zip_longest(*per_base) for j in group if j is not None]
            if not jobs:
                break
            log_rung(rung, len(jobs) // n, self.rungs[rung], n)
            self._live = (state, rung)
            self.execute(jobs)
            self._live = None
            if self.dry:
                self._write(state)  # the candidates, their predictions and what was dropped
                return []
            for st in state:
                self._score(st, rung)
            self._write(state)
        self._write(state)
        record_bests(self.sweep_dir)
        return []

    def run_ended(self, job: Job) -> None:
        """After each run of a rung (the Runner's per-run hook): tune.json with what the rung has measured so far,
        nothing promoted, so that a search killed mid-rung leaves its completed trials and the current leader."""
        if self._live is None:
            return
        state, rung = self._live
        for st in state:
            self._measure(st, rung)
        self._write(state)

    def _score(self, st: dict, rung: int) -> None:
        """Read this rung's trials; promote the fastest ``keep`` fraction.  A trial is ranked by its
        median step (tokens per step / median step time): a short trial's mean carries its slowest steps
        (a late compile, an allocator warm-up, host jitter) at full weight."""
        ran = self._measure(st, rung)
        ok = sorted((t for t in ran if str(rung) in t.get("measured", {})), key=lambda t: -_score_at(t, rung))
        n_keep = max(1, math.ceil(len(ok) * self.keep)) if rung + 1 < len(self.rungs) else 0
        for t in ok[:n_keep] if len(ok) > 1 else []:
            t["promoted"] = True

    def _measure(self, st: dict, rung: int) -> list[dict]:
        """This rung's trials of a base, each with its status and measurement as its run folders say (the median
        of its repeats that completed)."""
        ran = [t for t in st["trials"] if t["rung"] == rung]
        for t in ran:
            done, statuses = [], []
            for j in t["jobs"]:
                m = read_json_dict(self.sweep_dir / j.dir / "metrics.json") or {}
                r = read_result(self.sweep_dir / j.dir)
                thr, step = m.get("throughput") or {}, m.get("step_time_s") or {}
                statuses.append(r.status if r else "unknown")
                if r and r.status == "completed" and thr.get("tokens_per_step") and step.get("median"):
                    done.append((thr["tokens_per_step"] / step["median"], thr.get("tokens_per_s"), j.dir))
            # a trial's status: completed when every run did, else the first run's that did not
            t.update(status=next((x for x in statuses if x != "completed"), "completed"),
                     dir=t["jobs"][0].dir, tokens_per_s=statistics.median(d[1] for d in done) if done else None)
            if done:  # the median of the repeats that completed, as the analysis takes it (a budget cut the rest)
                t.setdefault("measured", {})[str(rung)] = {
                    "median_step_tokens_per_s": statistics.median(d[0] for d in done),
                    "tokens_per_s": statistics.median(d[1] for d in done), "runs": len(done),
                    "dir": done[0][2], "dirs": [d[2] for d in done]}
        return ran

    def _write(self, state: list[dict]) -> None:
        from bench.plan.bests import user_store

        out = {"budget_min": self.budget_min, "spent_min": round(self.spent_min(), 2), "rungs": self.rungs,
               "keep": self.keep, "repeats": self.repeats, "time": time.time(), "drop_below": DROP_BELOW,
               "dropped_by_prediction": sum(st.get("dropped", 0) for st in state), "store": str(user_store()),
               "bases": []}
        for st in state:
            trials = [{k: v for k, v in t.items() if k not in ("jobs", "promoted")} for t in st["trials"]]
            top, at = winner(trials)
            entry = {"base": st["base"], "trials": trials, "winner": None, "command": None,
                     "dropped_by_prediction": st.get("dropped", 0)}
            if top:
                knobs = [o for o in top["overrides"] if o not in st["base"]]
                m = top["measured"][str(at)]
                entry["winner"] = {"name": top["name"], "overrides": knobs, "tokens_per_s": m["tokens_per_s"],
                                   "median_step_tokens_per_s": m["median_step_tokens_per_s"], "rung": at,
                                   "dir": m["dir"], "not_compared_with": unmeasured_survivors(trials, at)}
                entry["command"] = rerun_command(st["base"] + knobs)
            out["bases"].append(entry)
        write_json_atomic(Path(self.sweep_dir) / RESULT, out)


def by_prediction(st: dict) -> list[Job]:
    """Rung 0's runs of a base, the default first (the reference every gain is measured against), the others
    by predicted tokens/s (bench/plan/predict.py), without those predicted below DROP_BELOW of the best predicted
    (never measured: tune.json names them and why).  As they are where nothing can be predicted (a CPU run)."""
    from bench.plan.prediction_text import predicted

    trials = [t for t in st["trials"] if t["rung"] == 0]
    for t in trials:
        j = t["jobs"][0]
        pred = predicted(j.plan) if j.plan is not None and j.action in ("run", "skip") else None
        t["predicted_tokens_per_s"] = pred["tokens_per_s"] if pred else None
    known = [t for t in trials if t["predicted_tokens_per_s"]]
    st["dropped"] = 0
    if not known:
        return [j for t in trials for j in t["jobs"]]
    top = max(known, key=lambda t: t["predicted_tokens_per_s"])
    best = top["predicted_tokens_per_s"]
    for t in known:
        p = t["predicted_tokens_per_s"]
        if t["name"] != "default" and t["jobs"][0].action == "run" and p < DROP_BELOW * best:
            t.update(rung=-1, status="dropped", dropped=f"predicted {p:,.0f} tokens/s, {p / best:.0%} of the best "
                     f"predicted ({top['name']}: {best:,.0f}), below {DROP_BELOW:.0%}: not measured")
            del t["jobs"]
            st["dropped"] += 1
    keep = sorted((t for t in trials if t["rung"] == 0),
                  key=lambda t: (t["name"] != "default", -(t["predicted_tokens_per_s"] or 0.0)))
    log.info("[tune] %s: %d candidate(s) in order of predicted tokens/s (best predicted: %s, %s), %d dropped as "
             "predicted below %.0f%% of it", _words(st["base"]),
             len(keep), top["name"], f"{best:,.0f}", st["dropped"], 100 * DROP_BELOW)
    return [j for t in keep for j in t["jobs"]]


def record_bests(sweep_dir: Path) -> None:
    """Every base's winner into the user's store of measured bests (bench/plan/bests.py), where tuning=best finds
    it; a store that cannot be written costs a warning, not the search."""
    from bench.plan import bests

    tune = read_json_dict(Path(sweep_dir) / RESULT) or {}
    try:
        entries = bests.from_tune(tune, lambda sub, d, key: read_json_dict(Path(sweep_dir) / d / "metrics.json"),
                                  str(Path(sweep_dir) / RESULT))
        if entries:
            log.info("[tune] %d winner(s) recorded in the store of measured bests %s (tuning=best finds them)",
                     len(entries), bests.record(entries))
    except OSError as e:
        log.warning("[tune] the winners could not be recorded in the store of measured bests: %s", e)


def _score_at(t: dict, rung: int) -> float:
    return t["measured"][str(rung)]["median_step_tokens_per_s"]


def unmeasured_survivors(trials: list[dict], rung: int) -> list[str]:
    """Trials promoted to ``rung`` that have no measurement there (the budget left them pending): the
    winner at that rung was not compared with them."""
    return [t["name"] for t in trials if t.get("rung", -1) >= rung and str(rung) not in t.get("measured", {})
            and t.get("status") == "pending"]


def log_rung(rung: int, n: int, steps: tuple, repeats: int = 1) -> None:
    log.info("[tune] rung %d: %d trial(s) at %d warm-up + %d timed steps%s", rung, n, steps[0], steps[1],
             f", {repeats} runs each (the median decides)" if repeats > 1 else "")


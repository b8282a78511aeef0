"""Calibrate the throughput prediction (bench/predict.py) on recorded runs, and measure its error.

    python -m bench.calibrate results/ [--out bench/calibration.json]

Reads every ``<folder>/runs.json`` under the given directories (a list of recorded runs' metrics.json),
keeps the completed runs whose configuration the current code still plans, fits the prediction's constants
(robust least squares on log step time: Levenberg-Marquardt with Huber weights and a weak pull towards
predict.DEFAULTS, numpy only) and writes them with the error measured leave-one-results-folder-out: each
folder's runs are predicted by constants fitted without that folder, so the error is what a new session's
runs would see.  The same held-out errors are summed up per case (GPU, nodes, strategy: ``error_by_case``), which
each prediction quotes for its own case (bench/predict.py ``case_error``), and beside them the error of the
roofline alone (predict.ROOFLINE: no fitted constant), so that what the fitted terms buy is on the page.  The measured step is the run's median step time (robust to a slow step); errors are on
tokens/s (tokens per step / step time).  Winner agreement: within each (model, GPU count, tokens per step,
device) with two strategies or more, the strategy predicted fastest (its fastest predicted run) is the
measured fastest or within 5% of it.

Recorded configurations lack the keys added since they ran: they get their schema defaults (the added knobs
did not exist, so the default is what ran), except where the default changed since (LEGACY: runs before
``metrics.step_timing`` existed synchronised after every step).  An alias recorded unresolved
(``${bench_alias:microbatches,null}``) reads as its default.  A configuration that today's rules refuse is
counted as not re-plannable and left out.  A recorded ``tuning=best`` configuration holds the values its
profile applied, so it is re-planned as it ran (tuning=default).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from bench.hardware import match
from bench.predict import BOUNDED, CALIBRATION, DEFAULTS, ROOFLINE, combine, gpu_type, host_key, plan_topology, terms
from bench.runs import with_added_defaults
from bench.schema import BenchConfig, fields_of

LEGACY = {("metrics", "step_timing"): "sync"}  # keys whose default changed since runs were recorded
HUBER = 0.10  # residuals (log step) beyond 10% weigh linearly: noisy trials do not steer the fit
PRIOR = 1e-4  # per run, the pull towards the starting constants (keeps unidentified ones physical)
HOST_PRIOR = 1e-3  # per run, the pull of each host's factor towards 1
HOST_CONSTANTS = ("per_layer", "per_microbatch", "per_step", "per_hook")  # what the host factor multiplies
_ALIAS = re.compile(r"^\$\{bench_alias:\w+,(.*)\}$")


# ------------------------------------------------------------------------------ reading runs
def _default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        d = f.default_factory()
        return dataclasses.asdict(d) if dataclasses.is_dataclass(d) else d
    return f.default


def _fill(values: dict, schema: type, path: tuple = ()) -> None:
    """Missing keys of a recorded section get their schema default (LEGACY's where it changed)."""
    for name, f in fields_of(schema).items():
        d = _default(f)
        if d is dataclasses.MISSING or (isinstance(d, str) and d.startswith("${")) or name == "hardware":
            continue
        if name not in values:
            values[name] = LEGACY.get((*path, name), d)
        elif isinstance(values[name], dict) and f.default_factory is not dataclasses.MISSING:
            sub = f.default_factory()
            if dataclasses.is_dataclass(sub):
                _fill(values[name], type(sub), (*path, name))
    for name, v in list(values.items()):
        hit = _ALIAS.match(v) if isinstance(v, str) else None
        if hit:
            raw = hit.group(1)
            values[name] = None if raw == "null" else int(raw) if raw.isdigit() else raw


def replan(record: dict):
    """The Plan of a recorded run under today's code (raises ConfigError / KeyError when it cannot be)."""
    from bench.config import validate
    from bench.strategies.registry import get_spec

    cfg = with_added_defaults({k: v for k, v in record["config"].items() if k != "_command"})
    cfg = json.loads(json.dumps(cfg))  # a deep copy: the record stays as read
    cfg.pop("hardware", None)
    _fill(cfg, BenchConfig)
    _fill(cfg["strategy"], get_spec(cfg["strategy"]["name"]).schema, ("strategy",))
    cfg["device"], cfg["tuning"] = "cuda", "default"  # the record is what ran, a tuning profile already applied
    return validate(cfg, gpus=cfg["world_size"])


def device_name(record: dict) -> Optional[str]:
    """The GPU a recorded run ran on, as nvidia-smi names it (provenance, else rank 0's record)."""
    devices = (record.get("provenance") or {}).get("devices") or []
    if devices:
        return devices[0].get("name") if isinstance(devices[0], dict) else devices[0]
    ranks = record.get("ranks") or [{}]
    return ranks[0].get("device_name")


def load_runs(dirs: list[Path]) -> tuple[list[dict], dict]:
    """Every completed, re-plannable run on a known GPU under ``dirs``: its folder, plan, device, terms, the
    measured median step and tokens per step; and the counts of what was left out and why."""
    runs, left = [], {"not_completed": 0, "not_replannable": 0, "unknown_device": 0, "why_not_replannable": {}}
    for path in sorted(p for d in dirs for p in ([d] if (d / "runs.json").exists() else d.glob("*/"))):
        if not (path / "runs.json").exists():
            continue
        for rec in json.loads((path / "runs.json").read_text()):
            if rec.get("status") != "completed" or not rec.get("config"):
                left["not_completed"] += 1
                continue
            try:
                plan = replan(rec)
            except Exception as e:  # noqa: BLE001 - any refusal of today's rules: not re-plannable
                left["not_replannable"] += 1
                why = left["why_not_replannable"]
                why[str(e)[:120]] = why.get(str(e)[:120], 0) + 1
                continue
            hw = match(device_name(rec))
            if hw is None:
                left["unknown_device"] += 1
                continue
            m, prov = plan.model, rec.get("provenance") or {}
            nodes = len((rec.get("placement") or {}).get("nodes") or {}) or plan_topology(plan, hw).nodes
            runs.append({"folder": path.name, "plan": plan, "device": hw.gpu, "terms": terms(plan, hw),
                         "case": (gpu_type(hw), str(nodes), plan.strategy["name"]),
                         "host": host_key(prov.get("hostname"), prov.get("cpu_count")),
                         "step": float(rec["step_time_s"]["median"]), "tokens": m["global_batch"] * m["seq_len"]})
    return runs, left


# ------------------------------------------------------------------------------ the fit
class Problem:
    """The fit's data: the runs' terms as arrays, their log step times and host indices; a parameter vector
    is the constants (logistic / log scale) followed by one log factor per host."""

    def __init__(self, runs: list[dict]):
        self.hosts = sorted({r["host"] for r in runs})
        self.t = stack(runs)
        self.host_index = np.array([self.hosts.index(r["host"]) for r in runs])
        self.y = np.log([r["step"] for r in runs])
        self.z0 = np.concatenate([_from_constants(DEFAULTS), np.zeros(len(self.hosts))])

    def constants(self, z: np.ndarray) -> dict:
        """Unconstrained vector -> constants: fractions through a logistic, the rest through exp."""
        return {k: float(1 / (1 + np.exp(-v)) if k in BOUNDED else np.exp(v)) for k, v in zip(DEFAULTS, z)}

    def residuals(self, z: np.ndarray) -> np.ndarray:
        t = dict(self.t, host_factor=np.exp(z[len(DEFAULTS):])[self.host_index])
        return np.log(combine(t, self.constants(z))["step_time_s"]) - self.y

    def cost(self, z: np.ndarray) -> float:
        """Huber loss of the log residuals plus the weak pull towards the starting point."""
        a = np.abs(self.residuals(z))
        data = np.sum(np.where(a <= HUBER, 0.5 * a * a, HUBER * (a - 0.5 * HUBER)))
        return float(data + 0.5 * self._prior() @ (z - self.z0) ** 2)

    def _prior(self) -> np.ndarray:
        n = len(self.y)
        return np.concatenate([np.full(len(DEFAULTS), PRIOR * n), np.full(len(self.hosts), HOST_PRIOR * n)])

    def normal_equations(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(J'WJ + prior, J'Wr + prior gradient) at z: Huber weights, forward-difference Jacobian."""
        r = self.residuals(z)
        w = np.minimum(1.0, HUBER / np.maximum(np.abs(r), 1e-12))
        jac = np.empty((len(r), len(z)))
        for j in range(len(z)):
            dz = z.copy()
            dz[j] += 1e-6
            jac[:, j] = (self.residuals(dz) - r) / 1e-6
        prior = self._prior()
        return jac.T @ (w[:, None] * jac) + np.diag(prior), jac.T @ (w * r) + prior * (z - self.z0)


def _from_constants(c: dict) -> np.ndarray:
    return np.array([np.log(c[k] / (1 - c[k])) if k in BOUNDED else np.log(c[k]) for k in DEFAULTS])


def stack(runs: list[dict]) -> dict:
    """Runs' terms as one numpy array per term (the prediction is vectorised over runs)."""
    return {k: np.array([r["terms"][k] for r in runs], dtype=float) for k in runs[0]["terms"]}


def fit(runs: list[dict], iterations: int = 200) -> dict:
    """Constants and host factors minimising the Huber loss of log step time (Levenberg-Marquardt from
    predict.DEFAULTS); the host factors are normalised to the median host's (module docstring of predict)."""
    p = Problem(runs)
    z, lam, best = p.z0.copy(), 1e-3, p.cost(p.z0)
    for _ in range(iterations):
        a, g = p.normal_equations(z)
        while lam < 1e10:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a)), -g)
            c = p.cost(z + step)
            if c < best:
                break
            lam *= 4
        if lam >= 1e10:
            break
        z, lam, gain, best = z + step, max(lam / 4, 1e-9), best - c, c
        if gain < 1e-9 * best:
            break
    return _median_host(p.constants(z), dict(zip(p.hosts, np.exp(z[len(DEFAULTS):]))))


def _median_host(constants: dict, factors: dict) -> dict:
    """Rescale so that the median host's factor is 1 (the host constants absorb it): the same predictions."""
    mid = float(np.median(list(factors.values())))
    for k in HOST_CONSTANTS:
        constants[k] *= mid
    return {"constants": constants, "host_factors": {h: float(f / mid) for h, f in factors.items()}}


def predict_runs(runs: list[dict], fitted: dict) -> np.ndarray:
    """Step times of runs under fitted constants; a host the fit did not see gets the median's factor."""
    t = dict(stack(runs), host_factor=np.array([fitted["host_factors"].get(r["host"], 1.0) for r in runs]))
    return combine(t, fitted["constants"])["step_time_s"]


# ------------------------------------------------------------------------------ the error
def agreement(items, within: float = 0.05) -> tuple[int, int]:
    """(groups where the predicted fastest strategy is the measured fastest or within ``within`` of it, groups
    of two or more strategies), from (group key, strategy, measured tokens/s, predicted tokens/s) items; a group
    is one workload: (model, GPU count, tokens per step, device).  Each strategy counts at its fastest run."""
    groups: dict[tuple, dict[str, list[float]]] = {}
    for key, strategy, measured, predicted in items:
        best = groups.setdefault(key, {}).setdefault(strategy, [0.0, 0.0])
        best[0], best[1] = max(best[0], measured), max(best[1], predicted)
    agree = total = 0
    for by_strategy in groups.values():
        if len(by_strategy) < 2:
            continue
        total += 1
        pick = max(by_strategy, key=lambda s: by_strategy[s][1])
        agree += (1 + within) * by_strategy[pick][0] >= max(v[0] for v in by_strategy.values())
    return int(agree), total


def winner_agreement(runs: list[dict], predicted: np.ndarray, within: float = 0.05) -> tuple[int, int]:
    """``agreement`` over calibration runs and their predicted step times."""
    return agreement((((r["plan"].model["name"], r["plan"].world_size, r["tokens"], r["device"]),
                       r["plan"].strategy["name"], r["tokens"] / r["step"], r["tokens"] / p)
                      for r, p in zip(runs, predicted)), within)


def error_statement(runs: list[dict], predicted: np.ndarray) -> dict:
    """Median / p90 absolute error of tokens/s (all runs, steps >= 100 ms) and the winner agreement."""
    measured = np.array([r["step"] for r in runs])
    err = np.abs(measured / predicted - 1)  # tokens/s: tokens / step
    long = measured >= 0.1
    agree, groups = winner_agreement(runs, predicted)
    return {"median_abs": float(np.median(err)), "runs": int(len(err)),
            "median_abs_step_ge_100ms": float(np.median(err[long])) if long.any() else None,
            "runs_step_ge_100ms": int(long.sum()), "p90_abs": float(np.percentile(err, 90)),
            "winner_agreement": agree / groups if groups else None, "winner_groups": groups,
            "winner_agree": agree}


def by_case(runs: list[dict], predicted: np.ndarray) -> dict:
    """Held-out error per GPU type, node count and strategy ("*": every strategy), as predict.case_error reads it:
    {gpu: {nodes: {strategy: {runs, median_abs, p90_abs}}}}."""
    err = np.abs(np.array([r["step"] for r in runs]) / predicted - 1)
    cases: dict = {}
    for i, r in enumerate(runs):
        gpu, nodes, strategy = r["case"]
        for key in (strategy, "*"):
            cases.setdefault(gpu, {}).setdefault(nodes, {}).setdefault(key, []).append(err[i])
    return {gpu: {nodes: {k: {"runs": len(v), "median_abs": float(np.median(v)), "p90_abs": float(np.percentile(v, 90))}
                          for k, v in sorted(by.items())} for nodes, by in per.items()} for gpu, per in cases.items()}


def leave_one_folder_out(runs: list[dict]) -> tuple[np.ndarray, dict]:
    """Each folder's runs predicted by constants fitted on the other folders; per-folder median errors."""
    predicted = np.empty(len(runs))
    per_folder = {}
    for folder in sorted({r["folder"] for r in runs}):
        inside = [i for i, r in enumerate(runs) if r["folder"] == folder]
        held = [runs[i] for i in inside]
        predicted[inside] = predict_runs(held, fit([r for r in runs if r["folder"] != folder]))
        errs = np.abs(np.array([r["step"] for r in held]) / predicted[inside] - 1)
        per_folder[folder] = {"runs": len(inside), "median_abs": float(np.median(errs))}
    return predicted, per_folder


# ------------------------------------------------------------------------------ command line
def calibrate(dirs: list[Path], out: Path = CALIBRATION, quiet: bool = False) -> dict:
    """Fit on every run, measure the error leave-one-folder-out, write ``out``; returns what was written."""
    runs, left = load_runs(dirs)
    if not runs:
        raise SystemExit(f"no completed, re-plannable runs under {', '.join(map(str, dirs))}")
    folders = sorted({r["folder"] for r in runs})
    if len(folders) > 1:
        predicted, per_folder = leave_one_folder_out(runs)
        method = f"leave-one-results-folder-out over {len(folders)} folders"
    else:
        predicted, per_folder = predict_runs(runs, fit(runs)), {}
        method = "in-sample (one folder: nothing to hold out)"
    error = {**error_statement(runs, predicted), "method": method}
    roofline = {**error_statement(runs, combine(stack(runs), ROOFLINE)["step_time_s"]),
                "method": "roofline: no fitted constant (bench/predict.py ROOFLINE)"}
    doc = {**fit(runs), "error": error, "roofline_error": roofline, "error_by_case": by_case(runs, predicted),
           "runs_left_out": left, "per_folder": per_folder, "fitted_on": {"folders": folders, "runs": len(runs)}}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    if not quiet:
        report(doc, out)
    return doc


def report(doc: dict, out: Path) -> None:
    e, left = doc["error"], doc["runs_left_out"]
    print(f"runs: {e['runs']} used; left out: {left['not_completed']} not completed, {left['not_replannable']} "
          f"not re-plannable, {left['unknown_device']} on an unknown GPU")
    print(f"accuracy, {e['method']} (|predicted / measured tokens/s - 1|):")
    print(f"  median absolute error, all runs:        {100 * e['median_abs']:.1f}%  ({e['runs']} runs)")
    if e["median_abs_step_ge_100ms"] is not None:
        print(f"  median absolute error, steps >= 100 ms: {100 * e['median_abs_step_ge_100ms']:.1f}%  "
              f"({e['runs_step_ge_100ms']} runs)")
    print(f"  90th percentile absolute error:         {100 * e['p90_abs']:.1f}%  ({e['runs']} runs)")
    if e["winner_agreement"] is not None:
        print(f"  winner agreement:                       {100 * e['winner_agreement']:.0f}%  "
              f"({e['winner_agree']} of {e['winner_groups']} groups)")
    print(roofline_table(e, doc["roofline_error"]))
    print("held out, per GPU / nodes (all strategies): " + "; ".join(
        f"{gpu} / {nodes} node{'s' if nodes != '1' else ''}: median {100 * by['*']['median_abs']:.1f}%, p90 "
        f"{100 * by['*']['p90_abs']:.1f}% ({by['*']['runs']} runs)"
        for gpu, per in sorted(doc["error_by_case"].items()) for nodes, by in sorted(per.items())))
    print("constants (all folders): " + ", ".join(f"{k}={v:.3g}" for k, v in doc["constants"].items()))
    print("host factors: " + ", ".join(f"{k} {v:.2f}" for k, v in doc["host_factors"].items()))
    print(f"wrote {out}")


def roofline_table(model: dict, roofline: dict) -> str:
    """The model's held-out error beside the roofline's (no fitted constants): what the fitted terms buy."""
    def cells(e: dict) -> str:
        long = e["median_abs_step_ge_100ms"]
        win = f"{e['winner_agree']}/{e['winner_groups']}" if e["winner_groups"] else "-"
        return (f"{100 * e['median_abs']:6.1f}%  {100 * long if long is not None else float('nan'):6.1f}%  "
                f"{100 * e['p90_abs']:6.1f}%  {win:>7}")
    return ("what the fitted terms buy (|predicted / measured tokens/s - 1|):\n"
            "                           median  >=100ms     p90   winner\n"
            f"  model, held out          {cells(model)}\n"
            f"  roofline, nothing fitted {cells(roofline)}  (matmuls at peak, bytes at link speed, no host)")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="results folders, or directories of them")
    ap.add_argument("--out", type=Path, default=CALIBRATION, help="the calibration file (default: %(default)s)")
    args = ap.parse_args(argv)
    calibrate(args.dirs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

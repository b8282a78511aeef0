"""Calibrate the throughput prediction (bench/plan/predict.py) on recorded runs, and measure its error.

    python -m bench.calibrate results/ [--out bench/plan/calibration.json] [--freeze FOLDER] [--unfreeze FOLDER]
    python -m bench.calibrate --frozen results/<folder> [...]     # score runs recorded after it, no refit
    python -m bench.calibrate --by-regime results/                # each link regime held out whole, its error
    python -m bench.calibrate --by-regime --runs 5 results/       # ... and each regime's 5 largest errors, run by run

Reads every ``<folder>/runs.json`` under the given directories (bench/run/recorded.py), fits the prediction's
constants (scipy.optimize.least_squares on log step time, Huber loss at HUBER, with a weak pull towards
predict.DEFAULTS) and writes them with the error measured leave-one-results-folder-out: each folder's runs are
predicted by constants fitted without that folder, so the error is what a new session's runs would see.  The same
held-out errors are summed up per case (GPU, nodes, strategy: ``error_by_case``), which each prediction quotes for
its own case (bench/plan/calibration_error.py ``case_error``), and beside them the error of the roofline alone
(predict.ROOFLINE: no fitted constant), so that what the fitted terms buy is on the page.  The measured step is
the run's median step time (robust to a slow step); errors are on tokens/s (tokens per step / step time).
Winner agreement: within each (model, GPU count, tokens per step, device) with two strategies or more, the
strategy predicted fastest (its fastest predicted run) is the measured fastest or within 5% of it.

Frozen folders (``frozen.folders`` of the calibration being replaced: ``--out`` where it exists, else the shipped
bench/plan/calibration.json; ``--freeze`` adds one): runs recorded after a calibration.  A fit never uses them, so its
constants scored on them is an error they never saw; the fit records that score, and ``--frozen`` recomputes it for
any folder outside the fit without writing anything.
``--unfreeze`` folds a folder into the fit (after which it is no longer evidence of anything out of sample).

The solver is scipy's (trust-region reflective); the loss is scipy's "huber" (f_scale = HUBER) on the runs'
residuals and the plain square on the prior's, passed as a callable (``Problem.loss``) because a string loss applies
to every residual: with loss="huber" on all, the prior turns linear beyond HUBER and the fit ended at a higher value
of this objective and a worse held-out error.

Set by hand, not fitted: bench/costs/traffic.py DTENSOR_LAYER_HOST, ZeRO's FETCH_OPS and PARAM_OPS, Megatron's PARAM_OPS,
predict.COLLECTIVE_LATENCY_S and bench/plan/link_terms.py HOST_LINK_GBPS.  Each was halved and doubled, refitted and
held out by folder: no move improved the held-out error on steps >= 100 ms by more than a tenth of a point, and the one that
lowered the fit cost most (Megatron's PARAM_OPS halved) worsened it: the runs do not pin these better than their
measured evidence (comments at each), and fitting them would mean one host-count term per strategy in the traffic
dicts, a larger model.  The pipeline's 4 hooks per micro-batch (bench/costs/traffic.py) and OPTIMIZER_PASSES (bytes
counted, not fitted) were not varied.

The matmuls are fitted against a measured peak (predict.peak_ratio), so that a probe's profile needs no refit.  Each
recorded run has rank 0's measured peak, but taking every run at its own measurement did not help: the runs are taken
at the typical share, predict.MEASURED_OVER_DATASHEET, which leaves the model as it was up to the prior on e_max.

The numbers of these comparisons, as measured on the day (they are a record, not the current fit's): docs/results.md,
"How the fit was chosen".  The current fit's error: bench/plan/calibration.json, and docs/results.md's block it renders.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

import numpy as np
from scipy.optimize import least_squares

from bench.plan.calibration_error import (agreement, by_case, by_layout, error_statement, error_table,  # noqa: F401
                                     link_words, per_folder, report, run_errors, run_table, write_docs)
from bench.run.recorded import device_name, load_runs, probe_of, replan, result_folders  # noqa: F401 - also read here
from bench.plan.predict import BOUNDED, CALIBRATION, DEFAULTS, ROOFLINE, combine, load_calibration

HUBER = 0.10  # residuals (log step) beyond 10% weigh linearly: noisy trials do not steer the fit
PRIOR = 1e-4  # per run, the pull towards the starting constants (keeps unidentified ones physical)
HOST_PRIOR = 1e-3  # per run, the pull of each host's factor towards 1
HOST_CONSTANTS = ("per_layer", "per_microbatch", "per_step", "per_hook")  # what the host factor multiplies


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
        n = len(self.y)
        weights = np.concatenate([np.full(len(DEFAULTS), PRIOR * n), np.full(len(self.hosts), HOST_PRIOR * n)])
        self.prior = np.sqrt(weights)

    def constants(self, z: np.ndarray) -> dict:
        """Unconstrained vector -> constants: fractions through a logistic, the rest through exp."""
        return {k: float(1 / (1 + np.exp(-v)) if k in BOUNDED else np.exp(v)) for k, v in zip(DEFAULTS, z)}

    def residuals(self, z: np.ndarray) -> np.ndarray:
        """Log step residuals of every run, then the prior's (sqrt(weight) x distance from the start)."""
        t = dict(self.t, host_factor=np.exp(z[len(DEFAULTS):])[self.host_index])
        data = np.log(combine(t, self.constants(z))["step_time_s"]) - self.y
        return np.concatenate([data, self.prior * (z - self.z0)])

    def loss(self, s: np.ndarray) -> np.ndarray:
        """least_squares' robust loss rho(s), rho', rho'' of s = (residual / HUBER)^2: scipy's "huber" on the runs'
        residuals, the plain square on the prior's (a prior pulls the same at any distance)."""
        out = np.array([s, np.ones_like(s), np.zeros_like(s)])
        d = s[:len(self.y)]
        big, root = d > 1, np.sqrt(np.maximum(d, 1.0))
        out[0, :len(d)] = np.where(big, 2 * root - 1, d)
        out[1, :len(d)] = np.where(big, 1 / root, 1.0)
        out[2, :len(d)] = np.where(big, -0.5 / root ** 3, 0.0)
        return out


def _from_constants(c: dict) -> np.ndarray:
    return np.array([np.log(c[k] / (1 - c[k])) if k in BOUNDED else np.log(c[k]) for k in DEFAULTS])


def stack(runs: list[dict]) -> dict:
    """Runs' terms as one numpy array per term (the prediction is vectorised over runs)."""
    return {k: np.array([r["terms"][k] for r in runs], dtype=float) for k in runs[0]["terms"]}


def fit(runs: list[dict]) -> dict:
    """Constants and host factors minimising the Huber loss of log step time from predict.DEFAULTS; the host
    factors are normalised to the median host's (module docstring of predict)."""
    p = Problem(runs)
    z = least_squares(p.residuals, p.z0, loss=p.loss, f_scale=HUBER, x_scale="jac").x
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


def leave_one_folder_out(runs: list[dict]) -> np.ndarray:
    """Each folder's runs predicted by constants fitted on the other folders."""
    predicted = np.empty(len(runs))
    for folder in sorted({r["folder"] for r in runs}):
        inside = [i for i, r in enumerate(runs) if r["folder"] == folder]
        predicted[inside] = predict_runs([runs[i] for i in inside], fit([r for r in runs if r["folder"] != folder]))
    return predicted


# ------------------------------------------------------------------------------ frozen folders
def frozen_runs(folders: list[Path], cal: dict) -> tuple[list[dict], dict, np.ndarray]:
    """The runs of ``folders``, what was left out of them, and their steps predicted with a calibration's constants
    (no refit)."""
    runs, left = load_runs(folders) if folders else ([], {})
    return runs, left, predict_runs(runs, cal) if runs else np.empty(0)


def score_frozen(folders: list[Path], cal: dict, scored: Optional[tuple] = None) -> dict:
    """Runs of ``folders`` predicted with a calibration's constants, no refit (``scored``: ``frozen_runs``' answer,
    where the caller has it): the model's and the roofline's error, per folder, and what was left out (``error``
    None where no run could be scored)."""
    names = [f.name for f in folders]
    runs, left, predicted = scored or frozen_runs(folders, cal)
    out = {"folders": names, "error": None, "roofline_error": None, "per_folder": {}, "runs_left_out": left}
    if runs:
        out.update(error={**error_statement(runs, predicted), "method": "frozen: recorded after the fit, not refitted"},
                   roofline_error=error_statement(runs, combine(stack(runs), ROOFLINE)["step_time_s"]),
                   per_folder=per_folder(runs, predicted))
    return out


def frozen_names(out: Path, freeze: list[str], unfreeze: list[str]) -> list[str]:
    """The frozen folders: those of the calibration being replaced (``out``, else the shipped one), plus
    ``freeze``, less ``unfreeze``."""
    before = (load_calibration(out if Path(out).exists() else None).get("frozen") or {}).get("folders") or []
    return sorted((set(before) | set(freeze)) - set(unfreeze))


# ------------------------------------------------------------------------------ command line
def calibrate(dirs: list[Path], out: Path = CALIBRATION, quiet: bool = False, freeze: tuple = (),
              unfreeze: tuple = ()) -> dict:
    """Fit on every run outside the frozen folders, measure the error leave-one-folder-out, score the frozen
    folders, write ``out`` (and docs/results.md's block when ``out`` is the shipped file); returns what was written."""
    frozen = frozen_names(out, list(freeze), list(unfreeze))
    found = result_folders(dirs)
    runs, left = load_runs([f for f in found if f.name not in frozen])
    if not runs:
        raise SystemExit(f"no completed, re-plannable runs under {', '.join(map(str, dirs))} outside the frozen "
                         f"folders ({', '.join(frozen) or 'none'})")
    folders, fitted = sorted({r["folder"] for r in runs}), fit(runs)
    if len(folders) > 1:
        predicted, method = leave_one_folder_out(runs), f"leave-one-results-folder-out over {len(folders)} folders"
    else:
        predicted, method = predict_runs(runs, fitted), "in-sample (one folder: nothing to hold out)"
    frozen_folders = [f for f in found if f.name in frozen]
    after = frozen_runs(frozen_folders, fitted)
    scored = score_frozen(frozen_folders, fitted, after)
    # the layout error counts the frozen runs beside the held-out ones
    every, every_predicted = runs + after[0], np.concatenate([predicted, after[2]])
    doc = {**fitted, "error": {**error_statement(runs, predicted), "method": method},
           "roofline_error": {**error_statement(runs, combine(stack(runs), ROOFLINE)["step_time_s"]),
                              "method": "roofline: no fitted constant (bench/plan/predict.py ROOFLINE)"},
           "error_by_case": by_case(runs, predicted), "runs_left_out": left,
           "error_by_layout": by_layout(every, every_predicted),
           "per_folder": per_folder(runs, predicted) if len(folders) > 1 else {},
           "fitted_on": {"folders": folders, "runs": len(runs)}, "frozen": {**scored, "folders": frozen},
           # what a prediction on a slow link quotes (bench/plan/calibration_error.py regime_error): each regime held out whole
           "error_by_regime": {k: {"runs": v["runs"], "fitted_on": v["fitted_on"], "probed_link": v["probed_link"],
                                   **(v["error"] or {})}
                               for k, v in by_regime(dirs).items()}}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    if Path(out).resolve() == CALIBRATION.resolve():
        write_docs(doc)
    if not quiet:
        report(doc, out)
    return doc


def frozen_report(dirs: list[Path], cal_path: Path = CALIBRATION) -> dict:
    """``--frozen``: score folders recorded after a calibration with its constants; prints, writes nothing."""
    if not Path(cal_path).exists():
        raise SystemExit(f"--frozen: calibration {cal_path} does not exist (valid: a file python -m bench.calibrate "
                         f"wrote, default {CALIBRATION})")
    cal = json.loads(Path(cal_path).read_text())
    folders = result_folders(dirs)
    fitted = sorted({f.name for f in folders} & set(cal["fitted_on"]["folders"]))
    if fitted:
        raise SystemExit(f"--frozen: {', '.join(fitted)} was fitted by {cal_path}: not a frozen evaluation "
                         f"(valid: folders outside fitted_on, e.g. those in its frozen list)")
    if not folders:
        raise SystemExit(f"--frozen: no results folder (with a runs.json) under {', '.join(map(str, dirs))}")
    scored = score_frozen(folders, cal)
    print(f"frozen: {', '.join(scored['folders'])} scored with {cal_path} (fitted on "
          f"{cal['fitted_on']['runs']} runs of {len(cal['fitted_on']['folders'])} folders), not refitted")
    print(error_table([("model, held out by folder", cal["error"]), ("model, these folders (frozen)", scored["error"]),
                       ("roofline, these folders", scored["roofline_error"])]))
    for name, v in scored["per_folder"].items():
        print(f"  {name}: median {100 * v['median_abs']:.1f}% ({v['runs']} runs)")
    return scored


def by_regime(dirs: list[Path]) -> dict[str, dict]:
    """``--by-regime``: each link regime (``link_regime``: default NVLink, peer-to-peer off, sockets, ...) held out
    whole: its runs predicted by constants fitted on every other regime's runs (frozen folders included: this is an
    evaluation across regimes, not the shipped fit), no refit on them; the error per regime."""
    runs, _ = load_runs(result_folders(dirs))
    out = {}
    for regime in sorted({r["regime"] for r in runs}):
        inside, rest = [r for r in runs if r["regime"] == regime], [r for r in runs if r["regime"] != regime]
        predicted = predict_runs(inside, fit(rest)) if rest else None
        out[regime] = {"runs": len(inside), "fitted_on": len(rest), "probed_link": probed_link(inside),
                       "error": error_statement(inside, predicted) if rest else None,
                       "per_run": run_errors(inside, predicted) if rest else []}
    return out


def probed_link(runs: list[dict]) -> Optional[dict]:
    """The link figures (intra_node_gbps) of the distinct probe profiles ``runs`` were planned with: how far one
    probe's figure, which the prediction scales with on a slow link, moved between probes of the same regime."""
    gbps = sorted({p for p in map(probe_of, (r["hardware"] for r in runs)) if p}, key=lambda p: p[2])
    if not gbps:
        return None
    return {"probes": len(gbps), "min_gbps": gbps[0][2], "max_gbps": gbps[-1][2]}


def regime_table(scores: dict[str, dict]) -> str:
    """The per-regime table ``--by-regime`` prints (docs/results.md quotes it)."""
    rows = ["| link regime (held out) | runs | fitted on | median | 90th percentile | winner right | probed link, "
            "GB/s |", "|---|---:|---:|---:|---:|---:|---|"]
    for regime, v in scores.items():
        e, link = v["error"], link_words(v.get("probed_link"))
        if e is None:
            rows.append(f"| {regime} | {v['runs']} | 0 | - | - | - | {link} |")
            continue
        win = f"{e['winner_agree']} of {e['winner_groups']}" if e["winner_groups"] else "no group"
        rows.append(f"| {regime} | {v['runs']} | {v['fitted_on']} | {100 * e['median_abs']:.1f}% | "
                    f"{100 * e['p90_abs']:.1f}% | {win} | {link} |")
    return "\n".join(rows)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="results folders, or directories of them")
    ap.add_argument("--out", "--calibration", dest="out", type=Path, default=CALIBRATION,
                    help="the calibration file written (read with --frozen; default: %(default)s)")
    ap.add_argument("--frozen", action="store_true",
                    help="score DIRS with the calibration in --out without refitting; writes nothing")
    ap.add_argument("--freeze", action="append", default=[], metavar="FOLDER",
                    help="keep this results folder (its name) out of the fit and score it as frozen")
    ap.add_argument("--unfreeze", action="append", default=[], metavar="FOLDER", help="fold a frozen folder back in")
    ap.add_argument("--by-regime", action="store_true", help="hold each link regime out whole (fit on the others) "
                    "and print its error; writes nothing")
    ap.add_argument("--runs", type=int, default=0, metavar="N",
                    help="with --by-regime: also each regime's N runs of largest error, run by run")
    args = ap.parse_args(argv)
    if args.runs < 0:
        ap.error(f"--runs {args.runs}: give how many runs to list per regime, 0 or more")
    if args.runs and not args.by_regime:
        ap.error(f"--runs {args.runs}: lists the runs of --by-regime's held-out regimes; add --by-regime")
    if args.by_regime:
        scores = by_regime(args.dirs)
        print(regime_table(scores))
        for regime, v in scores.items() if args.runs else ():
            print(f"\n{regime} held out: the {min(args.runs, len(v['per_run']))} of {v['runs']} runs of largest error "
                  "(error: predicted over measured tokens/s, less 1)\n" + run_table(v["per_run"][:args.runs]))
    elif args.frozen:
        frozen_report(args.dirs, args.out)
    else:
        calibrate(args.dirs, args.out, freeze=args.freeze, unfreeze=args.unfreeze)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The calibration's error, as measured and as shown (bench/calibrate.py): median / p90 absolute error of
tokens/s, the same on steps of 100 ms or more, winner agreement, per case; the printed report and the
generated block of docs/results.md, both rendered from what bench/plan/calibration.json records."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Optional

import numpy as np

from bench.plan.link_terms import LINK_REGIME

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results.md"
BEGIN = "<!-- calibration: begin (python -m bench.calibrate writes this block from bench/plan/calibration.json) -->"
END = "<!-- calibration: end -->"
# docs/results.md's targets: on the runs held out by folder, and (issue 44) on runs no fit has seen
TARGETS = {"median_abs": ("≤ 15%", "-"), "median_abs_step_ge_100ms": ("≤ 10%", "≤ 5%"),
           "p90_abs": ("≤ 35%", "≤ 20%"), "winner": ("≥ 80%", "≥ 90%")}


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
    return agreement((((r["plan"].model.name, r["plan"].world_size, r["tokens"], r["device"]),
                       r["plan"].strategy.name, r["tokens"] / r["step"], r["tokens"] / p)
                      for r, p in zip(runs, predicted)), within)


def signed_errors(runs: list[dict], predicted: np.ndarray) -> np.ndarray:
    """Each run's predicted / measured tokens/s - 1 (its measured step over its predicted one, less 1): above 0 where
    the prediction was faster than the measurement."""
    return np.array([r["step"] for r in runs]) / predicted - 1


def run_words(plan) -> str:
    """A recorded run in a few words: model, strategy in its own words (StrategySpec.label: ZeRO's stage, offloads),
    GPUs, model-parallel sizes, micro-batch x accumulation, and precision and compile where not the default."""
    from bench.strategies.registry import get_spec  # the registry imports every strategy: only when asked

    lay, run, name = plan.layout, plan.run, plan.strategy.name
    strategy = " ".join(get_spec(name).label(name, dataclasses.asdict(plan.strategy)))
    words = [run.model.name, strategy, f"{plan.world_size} GPU" + "s" * (plan.world_size > 1)]
    words += [f"{k}={v}" for k, v in (("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp)) if v > 1]
    words.append(f"mb {lay.micro_batch_size} x {lay.grad_accum}")
    return " ".join(words + ([run.precision] if run.precision != "bf16" else []) + (["compiled"] if run.compile else []))


def run_errors(runs: list[dict], predicted: np.ndarray) -> list[dict]:
    """Each run's measured and predicted step (ms) and its signed error (``signed_errors``), the largest absolute
    error first: the runs a median and a 90th percentile sum up."""
    rows = [{"folder": r["folder"], "run": run_words(r["plan"]), "measured_ms": 1e3 * r["step"],
             "predicted_ms": 1e3 * float(p), "error": float(e)}
            for r, p, e in zip(runs, predicted, signed_errors(runs, predicted))]
    return sorted(rows, key=lambda row: -abs(row["error"]))


def run_table(rows: list[dict]) -> str:
    """``run_errors``' rows as a markdown table."""
    out = ["| run | folder | measured step, ms | predicted, ms | error |", "|---|---|---:|---:|---:|"]
    out += [f"| {r['run']} | {r['folder']} | {r['measured_ms']:.1f} | {r['predicted_ms']:.1f} | "
            f"{100 * r['error']:+.1f}% |" for r in rows]
    return "\n".join(out)


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


def per_folder(runs: list[dict], predicted: np.ndarray) -> dict:
    """Each folder's run count and median absolute error."""
    err = np.abs(signed_errors(runs, predicted))
    names = np.array([r["folder"] for r in runs])
    return {f: {"runs": int((names == f).sum()), "median_abs": float(np.median(err[names == f]))}
            for f in sorted(set(names))}


def by_case(runs: list[dict], predicted: np.ndarray) -> dict:
    """Held-out error per GPU type, node count and strategy ("*": every strategy), as predict.case_error reads it:
    {gpu: {nodes: {strategy: {runs, median_abs, p90_abs}}}}."""
    err = np.abs(signed_errors(runs, predicted))
    cases: dict = {}
    for i, r in enumerate(runs):
        gpu, nodes, strategy = r["case"]
        for key in (strategy, "*"):
            cases.setdefault(gpu, {}).setdefault(nodes, {}).setdefault(key, []).append(err[i])
    return {gpu: {nodes: {k: {"runs": len(v), "median_abs": float(np.median(v)), "p90_abs": float(np.percentile(v, 90))}
                          for k, v in sorted(by.items())} for nodes, by in per.items()} for gpu, per in cases.items()}


# ------------------------------------------------------------------------------ shown
def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def error_table(rows: list[tuple[str, Optional[dict]]]) -> str:
    """Named error statements side by side, one row each (a row without runs reads "none")."""
    lines = ["error of tokens/s, |predicted / measured - 1|:",
             "                                    runs   median  >=100ms      p90   winner"]
    for name, e in rows:
        if not e or not e.get("runs"):
            lines.append(f"  {name:<32}  none")
            continue
        win = f"{e['winner_agree']}/{e['winner_groups']}" if e["winner_groups"] else "-"
        lines.append(f"  {name:<32}{e['runs']:>6} {_pct(e['median_abs']):>8} {_pct(e['median_abs_step_ge_100ms']):>8}"
                     f" {_pct(e['p90_abs']):>8} {win:>8}")
    return "\n".join(lines)


def report(doc: dict, out: Optional[Path]) -> None:
    """What ``python -m bench.calibrate`` prints after a fit."""
    e, left, frozen = doc["error"], doc["runs_left_out"], doc.get("frozen") or {}
    print(f"runs: {e['runs']} used; left out: {left['not_completed']} not completed, {left['not_replannable']} "
          f"not re-plannable, {left['unknown_device']} on an unknown GPU; frozen, not fitted: "
          f"{', '.join(frozen.get('folders') or []) or 'none'}")
    print(f"accuracy: {e['method']}; frozen folders scored with the fit's constants, never fitted")
    print(error_table([("model, held out by folder", e), ("model, frozen (recorded after)", frozen.get("error")),
                       ("roofline, nothing fitted", doc["roofline_error"])]))
    print("  (roofline: matmuls at the measured peak, bytes at link speed, no host time)")
    print("held out, per GPU / nodes (all strategies): " + "; ".join(
        f"{gpu} / {nodes} node{'s' if nodes != '1' else ''}: median {100 * by['*']['median_abs']:.1f}%, p90 "
        f"{100 * by['*']['p90_abs']:.1f}% ({by['*']['runs']} runs)"
        for gpu, per in sorted(doc["error_by_case"].items()) for nodes, by in sorted(per.items())))
    print("constants (all fitted folders): " + ", ".join(f"{k}={v:.3g}" for k, v in doc["constants"].items()))
    print("host factors: " + ", ".join(f"{k} {v:.2f}" for k, v in doc["host_factors"].items()))
    if out is not None:
        print(f"wrote {out}")


def _cell(e: Optional[dict], key: str) -> str:
    if not e or not e.get("runs"):
        return "none"
    if key == "winner":
        return f"{e['winner_agree']} of {e['winner_groups']} groups" if e["winner_groups"] else "no group"
    n = e["runs"] if key != "median_abs_step_ge_100ms" else e["runs_step_ge_100ms"]
    return f"{_pct(e[key])} of {n} runs" if e[key] is not None else "none"


def docs_block(doc: dict) -> str:
    """docs/results.md's throughput-error block, rendered from a calibration (tests check the file holds it)."""
    frozen, fitted = doc.get("frozen") or {}, doc["fitted_on"]
    names = ", ".join(f"`{f}/`" for f in frozen.get("folders") or []) or "none"
    rows = [("median absolute error", "median_abs"), ("the same, steps ≥ 100 ms", "median_abs_step_ge_100ms"),
            ("90th percentile", "p90_abs"), ("predicted fastest strategy is the measured fastest or within 5%",
                                             "winner")]
    table = [f"| throughput, \\|predicted / measured tokens/s − 1\\| | held out by folder | frozen | roofline, "
             "nothing fitted | target, held out | target, frozen |", "|---|---|---|---|---|---|"]
    table += [f"| {label} | {_cell(doc['error'], k)} | {_cell(frozen.get('error'), k)} | "
              f"{_cell(doc['roofline_error'], k)} | {TARGETS[k][0]} | {TARGETS[k][1]} |" for label, k in rows]
    folders = ", ".join(f"{f} {_pct(v['median_abs'])}" for f, v in sorted(doc["per_folder"].items()))
    return "\n".join([
        BEGIN, "", f"Fitted on {fitted['runs']} runs of {len(fitted['folders'])} results folders; held out by folder: "
        "each folder's runs predicted by constants fitted without it.  Frozen: runs recorded after the calibration, "
        f"never fitted, scored with its constants ({names}; `python -m bench.calibrate --frozen FOLDER` scores any "
        "such folder without refitting).  The roofline: matmuls at the measured peak, bytes at link speed, no host "
        "time.", "", *table, "", f"Held out, median per folder: {folders or 'one folder, nothing held out'}.", "", END])


def write_docs(doc: dict, path: Path = DOCS) -> bool:
    """Replace the block between BEGIN and END in ``path`` (False where the file has no block)."""
    text = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        return False
    path.write_text(pattern.sub(lambda _: docs_block(doc), text, count=1))
    return True


def docs_block_in(path: Path = DOCS) -> Optional[str]:
    """The block as docs/results.md holds it now (None without one)."""
    hit = re.search(re.escape(BEGIN) + ".*?" + re.escape(END), path.read_text(), re.S)
    return hit.group(0) if hit else None


CASE_MIN_RUNS = 5  # a strategy's own error is quoted from this many recorded runs of its case up; else its GPU's

# what a layout does beyond plain data parallelism in bf16, each a test on a plan: a prediction also quotes the error
# of the recorded runs that share the most of its features (one or two of them), the direction included, since a
# feature the prediction models less well shows there and not in its case's median (layout_error)
LAYOUT_FEATURES = {"fp8": lambda p: p.run.precision == "fp8", "tp > 1": lambda p: p.tp > 1,
                   "pp > 1": lambda p: p.pp > 1, "cp > 1": lambda p: p.layout.cp > 1,
                   "recompute": lambda p: p.layout.recompute != "none",
                   "offloaded activations": lambda p: bool(p.layout.offload_activations)}
LAYOUT_MIN_RUNS = 2


def layout_keys(plan) -> list[str]:
    """The groups a plan's run is counted in: each LAYOUT_FEATURE it has, and each pair of them (" & "-joined)."""
    names = [name for name, has in LAYOUT_FEATURES.items() if has(plan)]
    return names + [f"{a} & {b}" for i, a in enumerate(names) for b in names[i + 1:]]


def by_layout(runs: list[dict], predicted: np.ndarray) -> dict:
    """Error per layout feature and pair of features (" & "-joined): every run with them, its absolute error's median
    and 90th percentile, and in how many the prediction was faster than the measurement (``optimistic``) with the
    median signed error (predicted / measured tokens/s - 1)."""
    signed = signed_errors(runs, predicted)
    groups: dict[str, list[float]] = {}
    for r, e in zip(runs, signed):
        for key in layout_keys(r["plan"]):
            groups.setdefault(key, []).append(float(e))
    return {k: {"runs": len(v), "median_abs": float(np.median(np.abs(v))),
                "p90_abs": float(np.percentile(np.abs(v), 90)), "median": float(np.median(v)),
                "optimistic": int(sum(x > 0 for x in v))} for k, v in sorted(groups.items())}


def layout_error(cal: dict, plan) -> Optional[dict]:
    """The error of the recorded runs (held out by folder, or frozen) that share the most of this plan's layout
    features, from LAYOUT_MIN_RUNS runs up (the larger error between equally specific groups); None for a plan with
    none of them, or none recorded."""
    found = [(k.count(" & "), e["median_abs"], k, e) for k in layout_keys(plan)
             if (e := (cal.get("error_by_layout") or {}).get(k)) and e["runs"] >= LAYOUT_MIN_RUNS]
    if not found:
        return None
    *_, key, e = max(found, key=lambda f: f[:2])
    return {**e, "features": key}


def case_error(cal: dict, gpu: str, nodes: int, strategy: str) -> dict:
    """The held-out error measured on the recorded runs most like this prediction (bench/calibrate.py
    ``error_by_case``): this GPU type and node count with this strategy (at least CASE_MIN_RUNS runs), else with
    every strategy; ``runs`` 0 where none was recorded."""
    per = ((cal.get("error_by_case") or {}).get(gpu) or {}).get(str(nodes)) or {}
    where = f"{gpu} / {nodes} node{'s' if nodes != 1 else ''}"
    own = per.get(strategy) or {}
    if own.get("runs", 0) >= CASE_MIN_RUNS:
        return {**own, "case": f"{where} / {strategy}", "scope": "strategy"}
    if per.get("*"):
        return {**per["*"], "case": where, "scope": "gpu_nodes", "strategy_runs": own.get("runs", 0)}
    measured = sorted(f"{g} / {n} node{'s' if n != '1' else ''}" for g, by in (cal.get("error_by_case") or {}).items()
                      for n in by)
    return {"runs": 0, "case": where, "scope": "none", "measured_on": measured}


def regime_error(cal: dict, plan, hw) -> Optional[dict]:
    """On a slow link, the error measured with its whole link regime held out of the fit (``python -m
    bench.calibrate --by-regime``): the recorded runs like this one by GPU and strategy are NVLink runs, so their error
    says little here.  The regime is the run's ``link_regime``, else the one standing in for the hardware's link."""
    regime = plan.run.link_regime or "default"
    regime = regime if regime != "default" else LINK_REGIME.get(hw.intra_node_link or "", "default")
    e = (cal.get("error_by_regime") or {}).get(regime)
    return {**e, "regime": regime} if regime != "default" and e and e.get("median_abs") is not None else None


def link_words(link: Optional[dict]) -> str:
    """A regime's probed link figures (``probed_link``): "1.86-2.75 (3 probes)", or "-" without a probe."""
    if not link:
        return "-"
    span = f"{link['min_gbps']:.3g}" + (f"-{link['max_gbps']:.3g}" if link["max_gbps"] != link["min_gbps"] else "")
    return f"{span} ({link['probes']} probe{'s' if link['probes'] > 1 else ''})"

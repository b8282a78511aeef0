"""Prediction against measurement: every recorded run re-planned from its configuration with the current code.

``python -m multirun_analysis.prediction results/ [--out DIR]`` (or any run folders / ``runs.json``
files): writes ``prediction.csv`` and prints the four numbers bench's predictions are judged by:

1. memory: the share of completed GPU runs whose predicted peak (``memory_plan``'s allocated peak)
   is within +-10% of ``torch.cuda.max_memory_allocated``, and whether all are within +-15%;
2. the fit verdict both ways: completed runs predicted not to fit (must be none), and recorded
   out-of-memory runs predicted to fit without a ``tight`` flag (must be none);
3. throughput (bench/predict.py, where calibrated): median and 90th percentile of |predicted /
   measured - 1| over all runs and over runs whose step takes >= 100 ms;
4. the winner: within each (device, model, GPU count, tokens per step) group of two or more
   strategies, whether the predicted fastest is the measured fastest or within 5% of it.

The fit verdict is checked against the memory of the GPU each run was measured on (its preset in
bench/hardware.py).  ``python -m multirun_analysis DIR`` writes the same table for its runs.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd

COLUMNS = ["run", "model", "strategy", "world_size", "precision", "status", "measured_tokens_per_s",
           "predicted_tokens_per_s", "measured_peak_gib", "predicted_peak_gib", "predicted_fits"]
EXTRA = ["predicted_tight", "peak_error_pct", "tokens_error_pct", "step_time_s", "tokens_per_step", "device", "folder",
         "note"]
GIB = 2**30


def recorded(paths: Iterable) -> list[tuple[str, str, dict]]:
    """(folder, run name, metrics) of every recorded run: ``runs.json`` lists (results/) and run folders."""
    out = []
    for p in map(Path, paths):
        files = [p] if p.is_file() else sorted(p.rglob("runs.json")) + sorted(p.rglob("metrics.json"))
        for f in files:
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError):  # a broken file: the loader reports it (multirun_analysis/load.py)
                continue
            if f.name == "metrics.json" and isinstance(data, dict):
                out.append((str(f.parent.parent), f.parent.name, data))
            elif isinstance(data, list):
                out += [(f.parent.name, f"{f.parent.name}#{i}", m) for i, m in enumerate(data)
                        if isinstance(m, dict) and isinstance(m.get("status"), str)]
    return out


def _device(m: dict) -> Optional[str]:
    from bench.calibrate import device_name

    return device_name(m)


def _oom(m: dict) -> bool:
    text = f"{m.get('status')} {m.get('error')}".lower()
    return m.get("status") == "oom" or "out of memory" in text


def replan(m: dict):
    """(plan, memory plan) of a recorded run's configuration under the current code (bench/calibrate.py's
    re-planning, which the throughput calibration uses too; ConfigError if it no longer validates)."""
    from bench.calibrate import replan as recorded_plan
    from bench.hardware import match
    from bench.memory_model import memory_plan

    plan = recorded_plan(m)
    preset = match(_device(m))
    return plan, memory_plan(plan, gpu_memory_gib=preset.memory_gib if preset else None)


def _predicted_tokens(plan, device: Optional[str]) -> Optional[float]:
    try:
        from bench.predict import predict
        from bench.hardware import match
    except ImportError:
        return None
    try:
        return predict(plan, match(device))["tokens_per_s"]
    except Exception:  # noqa: BLE001  (an uncalibrated case: no prediction, said in the table)
        return None


def row(folder: str, name: str, m: dict) -> dict:
    """One prediction.csv row (COLUMNS + EXTRA)."""
    run = m.get("run") or {}
    out = {"run": name, "folder": folder, "model": run.get("model"), "strategy": run.get("strategy"),
           "world_size": run.get("world_size"), "precision": run.get("precision"),
           "status": "oom" if _oom(m) else m.get("status"), "device": _device(m),
           "measured_tokens_per_s": (m.get("throughput") or {}).get("tokens_per_s"),
           "step_time_s": (m.get("step_time_s") or {}).get("median")}
    peak = (m.get("memory") or {}).get("max_allocated_mb")
    out["measured_peak_gib"] = peak / 1024 if peak else None
    if not m.get("config") or out["device"] is None:
        return {**out, "note": "no configuration or no GPU recorded"}
    try:
        plan, mem = replan(m)
    except Exception as e:  # noqa: BLE001  (a config the current code refuses: said, not fatal)
        return {**out, "note": f"not re-plannable: {type(e).__name__}: {str(e)[:120]}"}
    out["tokens_per_step"] = plan.model["global_batch"] * plan.model["seq_len"]
    out.update(predicted_peak_gib=mem["predicted_peak_allocated_mb"] / 1024, predicted_fits=mem["fits"],
               predicted_tight=mem["tight"], predicted_tokens_per_s=_predicted_tokens(plan, out["device"]))
    if out["measured_peak_gib"] and out["status"] == "completed":
        out["peak_error_pct"] = 100 * (out["predicted_peak_gib"] / out["measured_peak_gib"] - 1)
    if out["predicted_tokens_per_s"] and out["measured_tokens_per_s"] and out["status"] == "completed":
        out["tokens_error_pct"] = 100 * (out["predicted_tokens_per_s"] / out["measured_tokens_per_s"] - 1)
    return out


def prediction_table(paths: Iterable) -> pd.DataFrame:
    rows = [row(*r) for r in recorded(paths)]
    return pd.DataFrame(rows, columns=COLUMNS + EXTRA)


def _winners(t: pd.DataFrame) -> tuple[int, int]:
    """The calibration's winner agreement (bench/calibrate.py ``agreement``) over the table's runs."""
    from bench.calibrate import agreement

    ok = t[t["tokens_error_pct"].notna()]
    return agreement((((r.model, r.world_size, r.tokens_per_step, r.device), r.strategy, r.measured_tokens_per_s,
                       r.predicted_tokens_per_s) for r in ok.itertuples()))


def accuracy(t: pd.DataFrame) -> dict:
    """The four numbers (module docstring)."""
    done = t[(t["status"] == "completed") & t["peak_error_pct"].notna()]
    err = done["peak_error_pct"].abs()
    oom = t[t["status"] == "oom"]
    thr = t[t["tokens_error_pct"].notna()]
    slow = thr[thr["step_time_s"] >= 0.1]
    q = lambda s, p: float(s.abs().quantile(p)) if len(s) else math.nan  # noqa: E731
    agree, groups = _winners(t)
    return {
        "memory_runs": len(done), "memory_within_10pct_share": float((err <= 10).mean()) if len(done) else math.nan,
        "memory_within_15pct_all": bool((err <= 15).all()), "memory_worst_pct": float(err.max()) if len(done) else None,
        "completed_predicted_oom": int((t[t["status"] == "completed"]["predicted_fits"] == False).sum()),  # noqa: E712
        "oom_runs": len(oom),
        "oom_predicted_to_fit": int(((oom["predicted_fits"] == True) & (oom["predicted_tight"] != True)).sum()),  # noqa
        "throughput_runs": len(thr), "throughput_median_pct": q(thr["tokens_error_pct"], 0.5),
        "throughput_p90_pct": q(thr["tokens_error_pct"], 0.9), "throughput_runs_ge_100ms": len(slow),
        "throughput_median_ge_100ms_pct": q(slow["tokens_error_pct"], 0.5),
        "winner_agreement": f"{agree}/{groups}", "not_replanned": int(t["note"].notna().sum()),
    }


def lines(acc: dict) -> list[str]:
    """The four numbers as text (CLI and report)."""
    return [
        f"memory plan: {100 * acc['memory_within_10pct_share']:.1f}% of {acc['memory_runs']} completed GPU runs "
        f"within +-10% of the measured peak; all within +-15%: {acc['memory_within_15pct_all']} "
        f"(worst {acc['memory_worst_pct']:.1f}%)" if acc["memory_runs"] else "memory plan: no completed GPU runs",
        f"fit verdict: {acc['completed_predicted_oom']} completed run(s) predicted not to fit; "
        f"{acc['oom_predicted_to_fit']} of {acc['oom_runs']} out-of-memory run(s) predicted to fit (not tight)",
        f"throughput: median |error| {acc['throughput_median_pct']:.1f}%, p90 {acc['throughput_p90_pct']:.1f}% over "
        f"{acc['throughput_runs']} runs; median {acc['throughput_median_ge_100ms_pct']:.1f}% over "
        f"{acc['throughput_runs_ge_100ms']} runs with steps >= 100 ms" if acc["throughput_runs"]
        else "throughput: no prediction (bench/predict.py not calibrated)",
        f"winner: predicted fastest strategy is the measured fastest or within 5% in {acc['winner_agreement']} "
        "groups (device, model, GPUs, tokens per step)",
        f"not re-planned (no config / GPU, or refused by the current code): {acc['not_replanned']} run(s)",
    ] + _held_out()


def _held_out() -> list[str]:
    """The throughput figures above use the shipped calibration, fitted on the recorded runs (in-sample);
    its held-out error is what python -m bench.calibrate measured leaving each results folder out."""
    try:
        from bench.predict import load_calibration

        e = load_calibration()["error"]
        return [f"throughput held out ({e['method']}; python -m bench.calibrate results/): median "
                f"{100 * e['median_abs']:.1f}% over {e['runs']} runs, {100 * e['median_abs_step_ge_100ms']:.1f}% over "
                f"{e['runs_step_ge_100ms']} runs with steps >= 100 ms, p90 {100 * e['p90_abs']:.1f}%, winner "
                f"{e['winner_agree']}/{e['winner_groups']} groups"]
    except (ImportError, KeyError, TypeError):
        return []


def by_strategy(t: pd.DataFrame) -> pd.DataFrame:
    """Per strategy: the memory plan's error (median, min, max, runs within +-10%) and the throughput error."""
    done = t[(t["status"] == "completed") & t["peak_error_pct"].notna()]
    rows = []
    for name, g in done.groupby("strategy"):
        e = g["peak_error_pct"]
        rows.append({"strategy": name, "runs": len(g), "median_error_pct": e.median(), "min_error_pct": e.min(),
                     "max_error_pct": e.max(), "within_10pct": int((e.abs() <= 10).sum()),
                     "tokens_median_abs_error_pct": g["tokens_error_pct"].abs().median()})
    return pd.DataFrame(rows)


def report_section(t: pd.DataFrame) -> list[str]:
    """report.md's "Prediction against measurement" (prediction.csv holds every run)."""
    if t is None or not len(t):
        return []
    return ["## Prediction against measurement", "",
            "Every run re-planned from its recorded configuration with the current code (`prediction.csv`; "
            "`python -m multirun_analysis.prediction DIR` prints the same): memory = the plan's allocated peak "
            "against `torch.cuda.max_memory_allocated`, error = predicted / measured - 1.", ""] + \
        [f"- {line}" for line in lines(accuracy(t))] + [""]


def _plan_records(paths: Iterable) -> list[tuple[dict, str]]:
    """(record, where) of every single dry run's ``plan.json`` and every dry-run sweep's ``plans.json``."""
    out = []
    for path in map(Path, paths):
        files = [path] if path.is_file() else sorted([*path.rglob("plan.json"), *path.rglob("plans.json")])
        for f in files:
            try:
                d = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(d, dict):
                out.append((d, str(f.parent)))
            elif isinstance(d, list):
                out += [(r, f"{f.parent}/{r.get('dir') or r.get('num')}") for r in d if isinstance(r, dict)]
    return out


def planned(paths: Iterable) -> pd.DataFrame:
    """A dry-run sweep's answer before any GPU is spent: every ``plan.json`` under ``paths`` (its layout, fit
    verdict and predicted tokens/s), fastest first per (model, GPU count, tokens per step); predicted, not
    measured."""
    rows = []
    for d, where in _plan_records(paths):
        cfg, mem, pred = d.get("config") or {}, d.get("memory") or {}, d.get("prediction") or {}
        if not mem:  # invalid: nothing planned
            continue
        lay = mem.get("layout") or {}
        rows.append({"run": where, "model": (cfg.get("model") or {}).get("name"),
                     "world_size": cfg.get("world_size"), "tokens_per_step": (cfg.get("model") or {}).get(
                         "global_batch", 0) * (cfg.get("model") or {}).get("seq_len", 0),
                     "strategy": _strategy_label(cfg.get("strategy") or {}),
                     "layout": f"tp={lay.get('tp')} pp={lay.get('pp')} dp={lay.get('dp')} "
                               f"mb={lay.get('micro_batch_size')}x{lay.get('microbatches')} rc={lay.get('recompute')}",
                     "fits": "no" if mem.get("fits") is False else ("tight" if mem.get("tight") else
                                                                     ("yes" if mem.get("fits") else "unknown")),
                     "predicted_peak_gib": (mem.get("predicted_peak_allocated_mb") or 0) / 1024,
                     "predicted_tokens_per_s": pred.get("tokens_per_s"),
                     "predicted_step_ms": 1000 * pred["step_time_s"] if pred.get("step_time_s") else None})
    t = pd.DataFrame(rows)
    if t.empty:
        return t
    t["_out"] = t["fits"] == "no"  # listed after the ranked layouts of their group
    t = t.sort_values(["model", "world_size", "tokens_per_step", "_out", "predicted_tokens_per_s"],
                      ascending=[True, True, True, True, False], na_position="last")
    return t.drop(columns="_out").reset_index(drop=True)


def _strategy_label(strategy: dict) -> str:
    """The strategy as the measured analysis names it (StrategySpec.label: ZeRO's stage, offloads), so that a
    dry run's rows (a search's four ZeRO stages among them) tell apart what the measured report does."""
    from bench.strategies.registry import get_spec

    name = str(strategy.get("name"))
    try:
        return " ".join(get_spec(name).label(name, strategy))
    except (KeyError, ValueError):  # a strategy this code no longer knows: its recorded name
        return name


def planned_section(t: pd.DataFrame) -> list[str]:
    """report.md's predicted ranking of a dry-run sweep, said to be predicted."""
    if t is None or t.empty:
        return []
    err = ""
    try:
        from bench.predict import load_calibration

        e = load_calibration().get("error") or {}
        err = (f" Measured error of such predictions: median {100 * e['median_abs']:.0f}%, 90th percentile "
               f"{100 * e['p90_abs']:.0f}% ({e.get('method')}).")
    except (ImportError, KeyError, TypeError):
        pass
    out = ["## Predicted ranking (dry run: planned, nothing measured)", "",
           "Each planned layout's fit verdict and predicted throughput (bench/predict.py), fastest first per "
           "model, GPU count and tokens per step; layouts that do not fit are listed, not ranked." + err, ""]
    cols = ["model", "world_size", "strategy", "layout", "fits", "predicted_peak_gib", "predicted_tokens_per_s"]
    out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in t.iterrows():
        cells = [r[c] if not isinstance(r[c], float) else (f"{r[c]:,.0f}" if c == "predicted_tokens_per_s"
                                                            else f"{r[c]:.1f}") for c in cols]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multirun_analysis.prediction", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="results/ folders, runs.json files or run folders")
    ap.add_argument("--out", default=None, help="folder for prediction.csv (default: none written)")
    a = ap.parse_args(argv)
    t = prediction_table(a.paths)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        t.to_csv(Path(a.out) / "prediction.csv", index=False)
    print("\n".join(lines(accuracy(t))))
    return 0 if len(t) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Prediction against measurement: every recorded run re-planned from its configuration with the current code.

``python -m multirun_analysis.prediction results/ [--out DIR]`` (or any run folders / ``runs.json``
files): writes ``prediction.csv`` and prints the four numbers bench's predictions are judged by:

1. memory: the share of completed GPU runs whose predicted peak (``memory_plan``'s allocated peak)
   is within +-10% of ``torch.cuda.max_memory_allocated``, and whether all are within +-15%;
2. the fit verdict both ways: completed runs predicted not to fit (must be none), and recorded
   out-of-memory runs predicted to fit without a ``tight`` flag (must be none);
3. throughput (bench/plan/predict.py, where calibrated): median and 90th percentile of |predicted /
   measured - 1| over all runs and over runs whose step takes >= 100 ms;
4. the winner: within each (device, model, GPU count, tokens per step) group of two or more
   strategies, whether the predicted fastest is the measured fastest or within 5% of it; the same over
   layouts (strategy variant x tp x pp x dp x micro-batch x accumulation x recompute x precision), and the
   Spearman rank correlation of predicted and measured tokens/s over each group's layouts.

Every row carries its layout (multirun_analysis/layouts.py: what ran, from metrics.json's ``layout``) and
its run ``key`` (bench.run.runs.run_key), by which a dry run's plan and its measurement are matched
(multirun_analysis/versus.py).

Each run is re-predicted with the hardware it recorded (``config.hardware``: the preset or probe profile it was
planned with, a profile's measured link included), else, for ``hardware=auto``, the preset of the GPU it was
measured on (bench/machine/hardware.py); the fit verdict is checked against that hardware's memory.  ``python -m multirun_analysis DIR`` writes the same table for its runs.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Iterable, Optional

import pandas as pd

from multirun_analysis import layouts
from multirun_analysis.planned import planned, planned_section  # noqa: F401  (the dry-run ranking, as before)

COLUMNS = ["run", "model", "strategy", "world_size", "precision", "status", "measured_tokens_per_s",
           "predicted_tokens_per_s", "measured_peak_gib", "predicted_peak_gib", "predicted_fits"]
LAYOUT = ["variant", "tp", "pp", "dp", "micro_batch_size", "grad_accum", "recompute", "layout"]
EXTRA = LAYOUT + ["key", "predicted_tight", "peak_error_pct", "tokens_error_pct", "step_time_s", "tokens_per_step", "device", "folder",
         "note", "hardware", "link_regime"]
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


def recorded_hardware(m: dict):
    """The hardware a run was planned for, as its record says (bench/machine/hardware.py ``recorded``): the preset or probe
    profile it named, else the preset of the GPU it ran on."""
    from bench.machine.hardware import recorded as recorded_hw

    return recorded_hw((m.get("config") or {}).get("hardware"), _device(m))


def hardware_label(m: dict) -> Optional[str]:
    """prediction.csv's ``hardware``: the name the prediction used and where its numbers came from."""
    hw = recorded_hardware(m)
    return None if hw is None else f"{hw.name} ({hw.source or 'user'})"


def replan(m: dict):
    """(plan, memory plan) of a recorded run's configuration under the current code (bench/calibrate.py's
    re-planning, which the throughput calibration uses too; ConfigError if it no longer validates), checked
    against the memory of the hardware the run recorded (:func:`recorded_hardware`)."""
    from bench.calibrate import replan as recorded_plan
    from bench.plan.memory_model import memory_plan

    plan = recorded_plan(m)
    hw = recorded_hardware(m)
    return plan, memory_plan(plan, gpu_memory_gib=hw.memory_gib if hw else oom_capacity_gib(m))


def oom_capacity_gib(m: dict) -> Optional[float]:
    """The device memory an out-of-memory record states in torch's own words ("GPU 1 has a total capacity of
    79.18 GiB"), for a record that names no GPU (older failure records): enough to re-plan its memory verdict."""
    import re

    texts = [f.get("message") or "" for f in m.get("failures") or []] + [str(m.get("error") or "")]
    found = next((re.search(r"total capacity of ([0-9.]+) GiB", t) for t in texts if "total capacity of" in t), None)
    return float(found.group(1)) if found else None


def _predicted_tokens(plan, m: dict) -> Optional[float]:
    """The prediction with the hardware the run recorded: what the run printed before it started, under the
    current code (a profile's measured link, not the GPU name's preset)."""
    try:
        from bench.plan.predict import predict
    except ImportError:
        return None
    try:
        return predict(plan, recorded_hardware(m))["tokens_per_s"]
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
    _layout(out, m, None)
    model = (m.get("config") or {}).get("model") or {}
    if model.get("global_batch") and model.get("seq_len"):  # the workload, also where the re-plan fails
        out["tokens_per_step"] = model["global_batch"] * model["seq_len"]
    if not m.get("config") or (out["device"] is None and oom_capacity_gib(m) is None):
        return {**out, "note": "no configuration or no GPU recorded"}
    try:
        plan, mem = replan(m)
    except Exception as e:  # noqa: BLE001  (a config the current code refuses: said, not fatal)
        return {**out, "note": f"not re-plannable: {type(e).__name__}: {str(e)[:120]}"}
    _layout(out, m, plan)
    out["tokens_per_step"] = plan.model.global_batch * plan.model.seq_len
    out.update(predicted_peak_gib=mem["predicted_peak_allocated_mb"] / 1024, predicted_fits=mem["fits"],
               predicted_tight=mem["tight"], predicted_tokens_per_s=_predicted_tokens(plan, m),
               hardware=hardware_label(m), link_regime=plan.run.link_regime)
    if out["measured_peak_gib"] and out["status"] == "completed":
        out["peak_error_pct"] = 100 * (out["predicted_peak_gib"] / out["measured_peak_gib"] - 1)
    if out["predicted_tokens_per_s"] and out["measured_tokens_per_s"] and out["status"] == "completed":
        out["tokens_error_pct"] = 100 * (out["predicted_tokens_per_s"] / out["measured_tokens_per_s"] - 1)
    return out


def _layout(out: dict, m: dict, plan) -> None:
    """The layout columns (what ran; the re-plan fills what an older record lacks) and the run key."""
    from bench.run.runs import run_key

    lay = layouts.from_record(m, plan)
    out.update({c: lay[c] for c in layouts.COLUMNS}, layout=layouts.text(lay))
    out["key"] = run_key(m["config"]) if isinstance(m.get("config"), dict) else None


def prediction_table(paths: Iterable) -> pd.DataFrame:
    rows = [row(*r) for r in recorded(paths)]
    return pd.DataFrame(rows, columns=COLUMNS + EXTRA)


# one workload on one GPU and link regime (bench/machine/link_regime.py): what is ranked
GROUP = ["device", "link_regime", "model", "world_size", "tokens_per_step"]


def _winners(t: pd.DataFrame, unit: str = "strategy") -> tuple[int, int]:
    """The calibration's winner agreement (bench/calibrate.py ``agreement``) over the table's runs, between
    strategies (``unit="strategy"``) or between layouts (``unit="layout"``: layouts.ident)."""
    from bench.calibrate import agreement

    ok = t[t["tokens_error_pct"].notna()]
    names = ok["strategy"] if unit == "strategy" else ok.apply(layouts.ident, axis=1)
    return agreement((((r.model, r.world_size, r.tokens_per_step, r.device, r.link_regime), n, r.measured_tokens_per_s,
                       r.predicted_tokens_per_s) for r, n in zip(ok.itertuples(), names)))


def rank_correlation(t: pd.DataFrame) -> pd.DataFrame:
    """Per workload group with 3 or more measured layouts: the Spearman rank correlation of predicted and
    measured tokens/s over its layouts (each at its fastest measured run), pandas' corr(method="spearman")."""
    ok = t[t["tokens_error_pct"].notna()].copy() if len(t) else t
    if ok.empty:
        return pd.DataFrame(columns=GROUP + ["layouts", "spearman"])
    ok["_layout"] = ok.apply(layouts.ident, axis=1)
    rows = []
    for keys, g in ok.groupby(GROUP, sort=True, dropna=False):
        per = g.groupby("_layout")[["measured_tokens_per_s", "predicted_tokens_per_s"]].max()
        if len(per) >= 3:
            rho = per.astype(float).corr(method="spearman").iloc[0, 1]
            rows.append({**dict(zip(GROUP, keys)), "layouts": len(per), "spearman": rho})
    return pd.DataFrame(rows, columns=GROUP + ["layouts", "spearman"])


def accuracy(t: pd.DataFrame) -> dict:
    """The four numbers (module docstring)."""
    done = t[(t["status"] == "completed") & t["peak_error_pct"].notna()]
    err = done["peak_error_pct"].abs()
    oom = t[t["status"] == "oom"]
    thr = t[t["tokens_error_pct"].notna()]
    slow = thr[thr["step_time_s"] >= 0.1]
    q = lambda s, p: float(s.abs().quantile(p)) if len(s) else math.nan  # noqa: E731
    agree, groups = _winners(t)
    lagree, lgroups = _winners(t, "layout")
    rho = rank_correlation(t)["spearman"]
    return {
        "memory_runs": len(done), "memory_within_10pct_share": float((err <= 10).mean()) if len(done) else math.nan,
        "memory_within_15pct_all": bool((err <= 15).all()), "memory_worst_pct": float(err.max()) if len(done) else None,
        "completed_predicted_oom": int((t[t["status"] == "completed"]["predicted_fits"] == False).sum()),  # noqa: E712
        "oom_runs": len(oom),
        "oom_predicted_to_fit": int(((oom["predicted_fits"] == True) & (oom["predicted_tight"] != True)).sum()),  # noqa
        "throughput_runs": len(thr), "throughput_median_pct": q(thr["tokens_error_pct"], 0.5),
        "throughput_p90_pct": q(thr["tokens_error_pct"], 0.9), "throughput_runs_ge_100ms": len(slow),
        "throughput_median_ge_100ms_pct": q(slow["tokens_error_pct"], 0.5),
        "winner_agreement": f"{agree}/{groups}", "layout_winner_agreement": f"{lagree}/{lgroups}",
        "spearman_groups": len(rho), "spearman_median": float(rho.median()) if len(rho) else math.nan,
        "not_replanned": int(t["note"].notna().sum()),
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
        else "throughput: no prediction (bench/plan/predict.py not calibrated)",
        f"winner: predicted fastest strategy is the measured fastest or within 5% in {acc['winner_agreement']} "
        "groups (device, link regime, model, GPUs, tokens per step); predicted fastest layout (strategy variant, tp, pp, dp, "
        f"micro-batch x accumulation, recompute, precision) likewise in {acc['layout_winner_agreement']} groups",
        f"rank correlation (Spearman, predicted vs measured tokens/s over each group's layouts): median "
        f"{acc['spearman_median']:.2f} over {acc['spearman_groups']} groups of 3 or more layouts"
        if acc["spearman_groups"] else "rank correlation: no group of 3 or more measured layouts",
        f"not re-planned (no config / GPU, or refused by the current code): {acc['not_replanned']} run(s)",
    ] + _held_out()


def _held_out() -> list[str]:
    """The throughput figures above use the shipped calibration, fitted on the recorded runs (in-sample);
    its held-out error is what python -m bench.calibrate measured leaving each results folder out."""
    try:
        from bench.plan.predict import load_calibration

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

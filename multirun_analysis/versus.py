"""A dry-run folder and a measured folder analysed together: one table, predicted beside measured per layout.

Matching: a planned layout and a measured run are one row when their run keys are equal (bench.run.runs.run_key:
``dry_run`` and ``hardware`` are volatile, so a dry run and the real run of one configuration share the key);
else when model, GPU count, tokens per step and layout (multirun_analysis/layouts.py ``ident``) are equal.  A
measured run that no plan matches keeps the prediction of its re-plan (``predicted_by`` says which), and a plan
that nothing measured keeps an empty measurement.  Repeats of one layout: the median of the completed ones.
"""
from __future__ import annotations

import pandas as pd

from multirun_analysis import layouts

WORKLOAD = ["model", "world_size", "tokens_per_step"]
COLUMNS = WORKLOAD + ["strategy", "precision", "layout", "fits", "rank", "predicted_tokens_per_s",
                      "measured_tokens_per_s", "error_pct", "predicted_peak_gib", "measured_peak_gib", "status",
                      "measured_runs", "predicted_by", "command"]


def _match_id(t: pd.DataFrame) -> pd.Series:
    strategy = t["variant"] if "variant" in t.columns else t["strategy"]
    lay = t.assign(variant=strategy)
    return lay.apply(lambda r: f"{r['model']}|{r['world_size']:g}|{r['tokens_per_step']:g}|{layouts.ident(r)}", axis=1)


def _measured(pred: pd.DataFrame) -> pd.DataFrame:
    """One row per measured run key: the median of its completed repeats (else its first status)."""
    rows = []
    for key, g in pred.groupby(pred["key"].fillna(pred["run"]), sort=False):
        done = g[g["status"] == "completed"]
        src = done if len(done) else g
        rows.append({**src.iloc[0].to_dict(), "key": key, "status": src["status"].iloc[0], "measured_runs": len(done),
                     "measured_tokens_per_s": src["measured_tokens_per_s"].median(),
                     "measured_peak_gib": src["measured_peak_gib"].median()})
    return pd.DataFrame(rows)


def side_by_side(plans: pd.DataFrame, prediction: pd.DataFrame) -> pd.DataFrame:
    """Every planned layout and every measured run, one row per layout (module docstring)."""
    if plans is None or plans.empty or prediction is None or prediction.empty:
        return pd.DataFrame(columns=COLUMNS)
    meas = _measured(prediction[prediction["tokens_per_step"].notna()])
    if meas.empty:  # runs without a GPU or a re-plannable configuration: nothing to match
        return pd.DataFrame(columns=COLUMNS)
    plans = plans.assign(_id=_match_id(plans), predicted_by="dry run")
    meas = meas.assign(_id=_match_id(meas))
    by_key = dict(zip(meas["key"], meas.index))
    by_id = dict(zip(meas["_id"], meas.index))
    used, rows = set(), []
    for _, p in plans.iterrows():
        i = by_key.get(p["key"], by_id.get(p["_id"]))
        m = meas.loc[i] if i is not None and i not in used else None
        used.add(i)
        rows.append({**{c: p.get(c) for c in COLUMNS if c in p.index}, **_measure(m)})
    for i, m in meas.drop(index=[i for i in used if i is not None]).iterrows():
        rows.append({**{c: m.get(c) for c in WORKLOAD + ["precision", "layout", "predicted_tokens_per_s",
                                                           "predicted_peak_gib"]},
                     "strategy": m.get("variant"), "predicted_by": "re-plan of the measured run"
                     if pd.notna(m.get("predicted_tokens_per_s")) else f"none: {m.get('note') or 'not predicted'}",
                     "fits": _fits(m), **_measure(m)})
    t = pd.DataFrame(rows, columns=COLUMNS)
    t["error_pct"] = 100 * (pd.to_numeric(t["predicted_tokens_per_s"]) / pd.to_numeric(t["measured_tokens_per_s"]) - 1)
    return t.sort_values(WORKLOAD + ["rank", "predicted_tokens_per_s"], ascending=[True] * 4 + [False],
                         na_position="last").reset_index(drop=True)


def _measure(m) -> dict:
    if m is None:
        return {"status": "not measured", "measured_runs": 0}
    return {"measured_tokens_per_s": m["measured_tokens_per_s"], "measured_peak_gib": m["measured_peak_gib"],
            "status": m["status"], "measured_runs": m["measured_runs"]}


def _fits(m) -> str:
    return "no" if m.get("predicted_fits") is False else ("tight" if m.get("predicted_tight") is True else
                                                          ("yes" if m.get("predicted_fits") is True else "unknown"))


CELLS = [("model", "model", str), ("world_size", "GPUs", "{:g}"), ("strategy", "strategy", str),
         ("precision", "precision", str), ("layout", "layout", str), ("fits", "fits", str),
         ("rank", "predicted rank", "{:.0f}"), ("predicted_tokens_per_s", "predicted tokens/s", "{:,.0f}"),
         ("measured_tokens_per_s", "measured tokens/s", "{:,.0f}"), ("error_pct", "error %", "{:+.1f}"),
         ("predicted_peak_gib", "predicted peak GiB", "{:.1f}"), ("measured_peak_gib", "measured peak GiB", "{:.1f}"),
         ("status", "measured", str), ("predicted_by", "predicted by", str)]


def section(t: pd.DataFrame) -> list[str]:
    """report.md's side-by-side table (the dry run's ranking and the measurement in one)."""
    from multirun_analysis.tables import md_table

    if t is None or t.empty:
        return []
    n = int((t["predicted_by"] == "dry run").sum())
    hit = int(((t["predicted_by"] == "dry run") & (t["measured_runs"] > 0)).sum())
    return ["## Predicted against measured, per layout", "",
            f"The dry run's {n} planned layout(s) beside what was measured ({hit} of them measured): matched by run "
            "key, else by model, GPUs, tokens per step and layout (strategy variant, tp, pp, dp, micro-batch size x "
            "accumulation steps, recompute, precision). Measured runs no plan matched are predicted by re-planning "
            "them with the current code. error = predicted / measured tokens/s - 1; repeats: median.", "",
            md_table(t, CELLS)]

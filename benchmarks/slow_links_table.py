"""The slow-link runs as a table: each run's link regime, the link NCCL used, the measured tokens/s, the prediction the
run printed before it started (the planner's choice under tuning=best: ``layout.tuning.planner.chosen``), the
re-prediction of ``python -m multirun_analysis.prediction`` (the hardware the run recorded) and the GPU name's preset's
(what the analysis used before; since the prediction refuses a link regime on hardware of another link, "refused"
where the run had one), each with its error; then per regime the median and worst |error|.

    python benchmarks/slow_links_table.py results/2026-11-27-h100x4-slow-links/runs.json
"""
from __future__ import annotations

import json
import re
import statistics
import sys

from multirun_analysis.prediction import prediction_table


def printed(m: dict):
    """The tokens/s the run's planner printed (``... : 12,345 tokens/s predicted``), else None."""
    text = (((m.get("layout") or {}).get("tuning") or {}).get("planner") or {}).get("chosen") or ""
    hit = re.search(r"([\d,]+) tokens/s predicted", text)
    return float(hit.group(1).replace(",", "")) if hit else None


def preset_prediction(m: dict):
    """The prediction with the GPU name's preset (hardware=auto's): how the analysis predicted before; None where
    the prediction refuses it (a link regime on the preset's NVLink: bench/plan/link_terms.py ``regime_mismatch``)."""
    from bench.calibrate import device_name, replan
    from bench.machine.hardware import match
    from bench.plan.prediction_text import predicted

    pred = predicted(replan(m), match(device_name(m)))
    return pred["tokens_per_s"] if pred else None


def pct(p, x):
    return None if p is None or not x else 100 * (p / x - 1)


def main(path: str) -> None:
    runs = json.loads(open(path).read())
    t = prediction_table([path])
    head = ("regime", "NCCL link", "model", "GPUs", "strategy", "layout", "measured", "printed", "err%", "re-predicted",
            "err%", "GPU preset", "err%")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    by_regime: dict = {}
    for m, row in zip(runs, t.itertuples()):
        if m.get("status") != "completed":
            continue
        nccl = (m.get("provenance") or {}).get("nccl") or {}
        meas, pr, re_, gp = (m["throughput"]["tokens_per_s"], printed(m), row.predicted_tokens_per_s,
                             preset_prediction(m))
        regime = m["config"].get("link_regime", "default")
        by_regime.setdefault(regime, []).append((pct(pr, meas), pct(re_, meas), pct(gp, meas)))
        f = lambda v, none="": none if v is None else f"{v:,.0f}"  # noqa: E731
        e = lambda v: "" if v is None else f"{v:+.1f}"  # noqa: E731
        print(f"| {regime} | {nccl.get('link')} | {m['run']['model']} | {m['run']['world_size']} | {row.strategy} | "
              f"{row.layout} | {f(meas)} | {f(pr)} | {e(pct(pr, meas))} | {f(re_)} | {e(pct(re_, meas))} | {f(gp, 'refused')} | "
              f"{e(pct(gp, meas))} |")
    print("\n| regime | runs | printed: median / worst abs err% | re-predicted | GPU preset |\n|---|---:|---|---|---|")
    for regime, errs in by_regime.items():
        cols = []
        for i in range(3):
            a = [abs(x[i]) for x in errs if x[i] is not None]
            cols.append(f"{statistics.median(a):.1f} / {max(a):.1f}" if a else "")
        print(f"| {regime} | {len(errs)} | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main(sys.argv[1])

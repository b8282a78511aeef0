"""How a prediction is said: its line with the error measured on the recorded runs most like it beside it, or why
there is none (no GPU named, or a link regime the hardware does not describe)."""
from __future__ import annotations

from typing import Optional

from bench.plan.link_terms import regime_mismatch
from bench.plan.predict import device_hardware, predict

NO_GPU = "no GPU to predict for: name one with hardware=<preset>"


def predicted(plan, hardware=None) -> Optional[dict]:
    """The throughput prediction of a plan (bench/plan/predict.py; on ``hardware`` where given, else the plan's), or
    None where it has none (``why_none``)."""
    try:
        return predict(plan, hardware)
    except ValueError:  # a CPU plan with hardware=auto; a link regime the hardware does not describe
        return None


def why_none(plan) -> str:
    """Why ``predicted`` gives a plan no prediction."""
    try:
        mismatch = regime_mismatch(plan.run.link_regime, device_hardware(plan))
    except ValueError:
        return NO_GPU
    return f"link_regime={plan.run.link_regime} {mismatch}" if mismatch else NO_GPU


def prediction_line(pred: Optional[dict], plan=None) -> str:
    """The prediction with the error measured on the recorded runs most like it beside it (never one without the
    other), and where its groups live; without one, why (given the ``plan``)."""
    if pred is None:
        return f"prediction: none ({NO_GPU if plan is None else why_none(plan)})"
    b = pred["breakdown"]
    return (f"prediction: {pred['tokens_per_s']:,.0f} tokens/s, step {1000 * pred['step_time_s']:.1f} ms = compute "
            f"{1000 * b['compute_s']:.1f} + exposed communication {1000 * b['exposed_comm_s']:.1f} + pipeline bubble "
            f"{1000 * b['bubble_s']:.1f} + host {1000 * b['host_s']:.1f} ms on {pred.get('topology', '?')}; "
            + error_words(pred))


def error_words(pred: dict) -> str:
    """How calibrated a prediction is: its case's held-out error (or its link regime's), or "uncalibrated" with what
    still holds; then the error of the recorded runs that share its layout's features, where there are some."""
    return case_words(pred) + layout_words(pred.get("layout_error"))


def layout_words(e: Optional[dict]) -> str:
    """The recorded runs with this layout's features (bench/plan/calibration_error.py ``layout_error``): their median
    error, and which way it went."""
    if not e:
        return ""
    return (f"; on the {e['runs']} recorded runs with {e['features']}: median {100 * e['median_abs']:.0f}%, measured "
            f"slower than predicted in {e['optimistic']} of {e['runs']} (median {100 * e['median']:+.0f}%)")


def case_words(pred: dict) -> str:
    """How calibrated a prediction is: its case's held-out error, or "uncalibrated" with what still holds."""
    c, e = pred.get("case_error") or {"runs": 0, "case": "?", "scope": "none"}, pred.get("error") or {}
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    held = "each predicted with its results folder held out; python -m bench.calibrate results/"
    r = pred.get("regime_error")
    if r:  # a slow link: the error measured with its regime held out of the fit, not the NVLink runs' of this case
        link = r.get("probed_link") or {}
        spread = (f"; the {link['probes']} recorded probes of this regime measured its link at {link['min_gbps']:.3g}-"
                  f"{link['max_gbps']:.3g} GB/s, and the prediction scales with the one it is given"
                  if link.get("probes", 0) > 1 else "")
        return (f"measured error on {r['runs']} recorded runs over the {r['regime']} link regime, held out of the fit "
                f"(python -m bench.calibrate --by-regime results/): median {pct(r['median_abs'])}, 90th percentile "
                f"{pct(r['p90_abs'])}, fastest strategy right in {r['winner_agree']} of {r['winner_groups']} groups"
                + spread)
    if c["scope"] == "strategy":
        return (f"measured error on {c['runs']} recorded {c['case']} runs: median {pct(c['median_abs'])}, "
                f"90th percentile {pct(c['p90_abs'])} ({held})")
    if c["scope"] == "gpu_nodes":
        return (f"measured error on {c['runs']} recorded {c['case']} runs of every strategy (this one: "
                f"{c['strategy_runs']}): median {pct(c['median_abs'])}, 90th percentile {pct(c['p90_abs'])} ({held})")
    expect = (f"expect errors beyond the measured median {pct(e['median_abs'])}, 90th percentile {pct(e['p90_abs'])} "
              f"on {', '.join(c.get('measured_on') or ['?'])}" if e.get("runs") else
              "expect errors of unknown size (no calibration: python -m bench.calibrate results/)")
    return (f"uncalibrated for {c['case']}: no recorded run; {expect}; what holds without "
            f"calibration: at most {pred['bound_tokens_per_s']:,.0f} tokens/s (matmuls at the datasheet peak, every "
            f"byte at its link's speed, all overlapped)")

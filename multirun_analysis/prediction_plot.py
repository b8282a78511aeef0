"""Predicted against measured tokens/s: one point per run (or layout), log axes, the y = x line and the +-10%
band, one marker per strategy, the legend outside the data.

Why log axes: the runs span CPU-sized to 8-GPU throughputs, and a relative error is a constant distance from
the diagonal on log axes at every scale.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from multirun_analysis.plots import NoDataError, number, styles

BAND = 0.10  # the +-10% band: the error the memory plan is held to, drawn for throughput as a reading aid


def plot_prediction(t: pd.DataFrame, by: str | None = None) -> Figure:
    """``t``: prediction.csv or the side-by-side table (columns measured_tokens_per_s, predicted_tokens_per_s
    and ``by``: the strategy variant by default)."""
    by = by or ("variant" if t is not None and "variant" in t.columns else "strategy")
    if t is None or t.empty or by not in t.columns:
        raise NoDataError("no runs with both a measured and a predicted throughput")
    d = t.assign(_m=pd.to_numeric(t["measured_tokens_per_s"], errors="coerce"),
                 _p=pd.to_numeric(t["predicted_tokens_per_s"], errors="coerce"))
    d = d[(d["_m"] > 0) & (d["_p"] > 0)]
    if d.empty:
        raise NoDataError("no runs with both a measured and a predicted throughput")
    fig = Figure(figsize=(7.5, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lo, hi = 0.8 * min(d["_m"].min(), d["_p"].min()), 1.25 * max(d["_m"].max(), d["_p"].max())
    ax.fill_between([lo, hi], [lo * (1 - BAND), hi * (1 - BAND)], [lo * (1 + BAND), hi * (1 + BAND)],
                    color="grey", alpha=0.18, lw=0, label=f"±{100 * BAND:.0f}%")
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, ls="--", label="predicted = measured")
    st = styles(d[by].map(str))
    for name, g in d.groupby(d[by].map(str), sort=True):
        s = st[name]
        ax.scatter(g["_m"], g["_p"], marker=s["marker"], color=s["color"], s=36, label=f"{name} ({len(g)})",
                   edgecolors="black", linewidths=0.4)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), aspect="equal",
           xlabel="measured tokens/s (log)", ylabel="predicted tokens/s (log)",
           title=f"Predicted against measured throughput ({len(d)} runs)")
    for axis in (ax.xaxis, ax.yaxis):  # 40,000 rather than 4x10^4
        axis.set_major_formatter(FuncFormatter(number))
        axis.set_minor_formatter(FuncFormatter(number))
    ax.grid(alpha=0.3, which="both")
    fig.legend(loc="outside right upper", fontsize="small", title=by)
    return fig

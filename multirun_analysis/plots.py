"""Plots of a summary table; each function returns a matplotlib Figure.

Figures are built with ``matplotlib.figure.Figure`` on an Agg canvas, not pyplot: no global
state, no display needed (headless CI), and a notebook shows the returned figure once.
A plot whose data is absent raises :class:`NoDataError` with the reason; ``make_plots``
turns that into a note, so a sweep without ZeRO runs simply has no variants plot.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.strategies.registry import specs
from multirun_analysis.summarize import variant_labels
from multirun_analysis.tables import devices_word, plain



class NoDataError(ValueError):
    """The summary holds nothing this plot could show."""


def _figure(n_panels: int, per_row: int = 3, w: float = 5.2, h: float = 3.8):
    rows, cols = math.ceil(n_panels / per_row), min(n_panels, per_row)
    fig = Figure(figsize=(w * cols, h * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]
    return fig, axes


def _need(s: pd.DataFrame, col: str, what: str) -> pd.DataFrame:
    if s is None or s.empty or col not in s.columns:
        raise NoDataError(f"no {what}: the summary has no '{col}' column or no rows")
    d = s[pd.to_numeric(s[col], errors="coerce").notna()]
    if d.empty:
        raise NoDataError(f"no {what}: '{col}' is empty for every experiment")
    return d


def _labels(s: pd.DataFrame) -> pd.Series:
    return s["label"] if "label" in s.columns else variant_labels(s)


MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # 7 shapes against 10 colours: a pair repeats only after 70
LINESTYLES = ("-", "--", ":", "-.")
HATCHES = ("", "//", "..", "xx")


def styles(labels) -> dict:
    """One style per label across all panels of a figure (same strategy, same look): tab10's colours, and a
    marker, line style and bar hatch that change where the colours repeat (beyond 10 series)."""
    names = sorted({str(x) for x in labels})
    cmap = matplotlib.colormaps["tab10"]
    return {n: {"color": cmap(i % 10), "marker": MARKERS[i % len(MARKERS)],
                "linestyle": LINESTYLES[(i // 10) % len(LINESTYLES)], "hatch": HATCHES[(i // 10) % len(HATCHES)]}
            for i, n in enumerate(names)}


def _legend(fig, axes):
    """One legend for the figure, outside the axes on the right (styles are the same in every panel), so that
    no data point is hidden behind it; PNGs are saved with bbox_inches="tight", so it is never clipped."""
    entries = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(lab, h)
    if entries:
        ncol = 1 if len(entries) <= 16 else 2
        longest = max(len(k) for k in entries)  # the legend's width is added to the figure's, not taken from the axes
        fig.set_figwidth(fig.get_figwidth() + ncol * (0.065 * longest + 0.7))
        fig.legend(list(entries.values()), list(entries), loc="outside right upper", fontsize="small", ncol=ncol)


def number(v, _=None) -> str:
    """An axis tick: thousands separated, small values (GiB on CPU runs) with their digits."""
    return f"{v:,.0f}" if abs(v) >= 100 or v == 0 else f"{v:.3g}"


def _gpu_axis(ax, ws):
    """world_size ticks; log2 spacing when the sweep spans 8x or more (1..8 GPUs)."""
    ws = sorted({float(w) for w in ws})
    if ws and ws[0] > 0 and ws[-1] / ws[0] >= 8:
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
    ax.set_xticks(ws, [f"{w:g}" for w in ws])


def _axis(s: pd.DataFrame) -> str:
    """The x axis of a plot against world_size: what it counts ("GPUs", "CPU ranks")."""
    return f"{devices_word(s)} (world_size)"


def _panels(s: pd.DataFrame, col: str, what: str):
    """The rows that have `col`, labelled and coloured, and a figure with one panel per model."""
    d = _need(s, col, what).copy()
    d["_label"] = _labels(d)
    models = list(dict.fromkeys(d["model"].map(str)))
    fig, axes = _figure(len(models))
    return d, models, styles(d["_label"]), fig, axes


def _lines_vs_gpus(s: pd.DataFrame, col: str, ylabel: str, title: str, what: str, scale: float = 1.0,
                   minmax: bool = True, ideal: float | None = None) -> Figure:
    d, models, colors, fig, axes = _panels(s, col, what)
    for ax, model in zip(axes, models):
        m = d[d["model"].map(str) == model]
        top = 0.0
        for label, g in m.groupby("_label", sort=True):
            g = g.sort_values("world_size")
            x, y = g["world_size"].astype(float), g[col].astype(float) * scale
            err = None
            if minmax and f"{col}_min" in g.columns:
                lo, hi = g[f"{col}_min"].astype(float) * scale, g[f"{col}_max"].astype(float) * scale
                err = [(y - lo).clip(lower=0).fillna(0), (hi - y).clip(lower=0).fillna(0)]
            st = colors[str(label)]
            ax.errorbar(x, y, yerr=err, marker=st["marker"], ls=st["linestyle"], capsize=3, label=label,
                        color=st["color"])
            top = max(top, (y + err[1] if err else y).max())
        if ideal is not None:
            ax.axhline(ideal, color="grey", ls="--", lw=1, label="ideal")
            top = max(top, ideal)
        _gpu_axis(ax, m["world_size"])
        # from zero, quantities and ratios alike: differences are not exaggerated
        ax.set_ylim(0, 1.08 * top if top > 0 else None)
        ax.yaxis.set_major_formatter(FuncFormatter(number))
        ax.set(xlabel=_axis(d), ylabel=ylabel, title=f"{title} — model {model}")
        ax.grid(alpha=0.3)
    _legend(fig, axes)
    return fig


def plot_throughput(summary: pd.DataFrame) -> Figure:
    """Throughput vs GPUs, one line per strategy variant, one panel per model."""
    return _lines_vs_gpus(summary, "tokens_per_s", "throughput [tokens/s]\n(median; bars: min–max of repeats)",
                          f"Throughput vs {devices_word(summary)}", "throughput")


def plot_scaling_efficiency(summary: pd.DataFrame) -> Figure:
    """Scaling efficiency (%) vs GPUs against the single-device baseline."""
    return _lines_vs_gpus(summary, "scaling_efficiency_pct", "scaling efficiency [%]\n(vs single-device baseline)",
                          "Scaling efficiency", "scaling efficiency (no single-device baseline?)",
                          minmax=False, ideal=100.0)


def plot_memory(summary: pd.DataFrame) -> Figure:
    """Peak memory per device vs GPUs in GiB, as the report speaks (CUDA allocator peak; host RSS on CPU runs)."""
    d = _need(summary, "mem_peak_mb", "memory measurements")
    src = ", ".join(sorted({str(x) for x in d.get("mem_source", pd.Series(dtype=object)).dropna()})) or "?"
    return _lines_vs_gpus(d, "mem_peak_mb", f"peak memory per device [GiB]\n({src})",
                          f"Peak memory vs {devices_word(d)}", "memory measurements", scale=1 / 1024)


def _bars(ax, cats: list[str], series: dict[str, dict[str, float]], ylabel: str, title: str,
          colors: dict | None = None):
    """Grouped bars: one group per category, one bar per series key."""
    n = max(len(series), 1)
    width = 0.8 / n
    colors = colors or styles(series)
    for i, (name, vals) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(cats))]
        st = colors[str(name)]
        ax.bar(xs, [vals.get(c, math.nan) for c in cats], width, label=name, color=st["color"], hatch=st["hatch"])
    ax.set_xticks(range(len(cats)), cats, rotation=20, ha="right")
    ax.yaxis.set_major_formatter(FuncFormatter(number))
    ax.set(ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, axis="y")


def plot_variants(summary: pd.DataFrame) -> Figure:
    """Each strategy's variants (those whose spec declares ``variants_figure``, e.g. ZeRO's stages):
    throughput and peak memory, bars per GPU count, a pair of panels per (strategy, model)."""
    figures = {n: s.variants_figure for n, s in specs().items() if s.variants_figure}
    if summary is None or "strategy" not in summary:
        raise NoDataError("no runs in the summary")
    panels = []
    for name, (knob, title) in figures.items():
        if knob not in summary:
            continue
        z = summary[(summary["strategy"] == name) & summary[knob].notna()].copy()
        if z.empty:
            continue
        z["_cat"] = [" ".join(specs()[name].label(name, {k: plain(v) for k, v in r.items()})) for _, r in z.iterrows()]
        panels += [(title, model, z[z["model"].map(str) == model]) for model in dict.fromkeys(z["model"].map(str))]
    if not panels:
        raise NoDataError("no runs of a strategy with a variants figure (" + ", ".join(
            f"strategy={n}: {t}" for n, (_, t) in figures.items()) + ")")
    fig, axes = _figure(2 * len(panels), per_row=2)
    _gpus = lambda w: devices_word(summary, w)  # noqa: E731
    look = styles({_gpus(w) for _, _, m in panels for w in m["world_size"]})  # one GPU count, one colour, everywhere
    for k, (title, model, m) in enumerate(panels):
        cats = sorted(m["_cat"].unique())
        for ax, col, ylabel, scale in ((axes[2 * k], "tokens_per_s", "throughput [tokens/s]", 1.0),
                                       (axes[2 * k + 1], "mem_peak_mb", "peak memory per device [GiB]", 1 / 1024)):
            series = {_gpus(w): dict(zip(g["_cat"], g[col].astype(float) * scale))
                      for w, g in m.groupby("world_size")}
            _bars(ax, cats, series, ylabel, f"{title}: {ylabel.split(' [')[0]} — model {model}", look)
    _legend(fig, axes)
    return fig


def plot_pp_microbatches(summary: pd.DataFrame) -> Figure:
    """Pipeline parallelism: throughput vs number of microbatches, line per (variant, GPUs)."""
    if summary is None or "pp" not in summary or "n_microbatches" not in summary:
        raise NoDataError("no pipeline-parallel runs (pp > 1 with microbatches) in the summary")
    # n_microbatches: the resolved count (the microbatches key column holds settings like "4p")
    p = summary[(pd.to_numeric(summary["pp"], errors="coerce") > 1) & summary["n_microbatches"].notna()].copy()
    if p.empty:
        raise NoDataError("no pipeline-parallel runs (pp > 1 with microbatches) in the summary")
    p["_label"] = variant_labels(p, exclude=("microbatches",))
    _gpus = lambda w: devices_word(p, w)  # noqa: E731
    models = list(dict.fromkeys(p["model"].map(str)))
    p["_series"] = [f"{lab} pp={int(float(pp))}, {_gpus(ws)}" for lab, pp, ws in zip(p["_label"], p["pp"], p["world_size"])]
    look = styles(p["_series"])
    fig, axes = _figure(len(models))
    for ax, model in zip(axes, models):
        m = p[p["model"].map(str) == model]
        for series, g in m.groupby("_series", sort=True):
            g = g.sort_values("n_microbatches")
            st = look[series]
            ax.plot(g["n_microbatches"].astype(float), g["tokens_per_s"].astype(float), marker=st["marker"],
                    ls=st["linestyle"], color=st["color"], label=series)
        mbs = sorted(m["n_microbatches"].astype(float).unique())
        ax.set_xticks(mbs, [f"{x:g}" for x in mbs])
        ax.yaxis.set_major_formatter(FuncFormatter(number))
        ax.set(xlabel="microbatches per step", ylabel="throughput [tokens/s]",
               title=f"Pipeline microbatches — model {model}")
        ax.grid(alpha=0.3)
    _legend(fig, axes)
    return fig


def plot_mfu(summary: pd.DataFrame) -> Figure:
    """MFU (%) by strategy variant, grouped by GPU count, one panel per model."""
    d, models, colors, fig, axes = _panels(
        summary, "mfu", "MFU (no known peak FLOP/s: CPU runs or unknown GPU; set metrics.peak_tflops)")
    _gpus = lambda w: devices_word(d, w)  # noqa: E731
    for ax, model in zip(axes, models):
        m = d[d["model"].map(str) == model]
        cats = [_gpus(w) for w in sorted(m["world_size"].astype(float).unique())]
        series = {lab: {_gpus(w): 100 * float(v) for w, v in zip(g["world_size"], g["mfu"])}
                  for lab, g in m.groupby("_label", sort=True)}
        _bars(ax, cats, series, "MFU [% of the device's peak FLOP/s]", f"MFU by strategy — model {model}", colors)
    _legend(fig, axes)
    return fig


def plot_time_breakdown(summary: pd.DataFrame) -> Figure:
    """Profiled runs (metrics.profile_steps > 0): one stacked bar per strategy variant and GPU count
    of a profiled step's time, mean over ranks (multirun_analysis/breakdown.py): compute only,
    communication overlapped with compute, exposed communication, idle."""
    from multirun_analysis.breakdown import STACK, profiled, stack_parts

    d = profiled(summary)
    if d.empty:
        raise NoDataError("no profiled runs with a time breakdown (run with metrics.profile_steps=k)")
    d["_label"] = _labels(d)
    _gpus = lambda w: devices_word(d, w)  # noqa: E731
    models = list(dict.fromkeys(d["model"].map(str)))
    fig, axes = _figure(len(models), per_row=2, w=max(6.0, 1.2 * d.groupby(d["model"].map(str)).size().max() + 2.5))
    for ax, model in zip(axes, models):
        m = d[d["model"].map(str) == model].sort_values(["world_size", "_label"], kind="stable")
        cats = [f"{lab}\n{_gpus(ws)}" for lab, ws in zip(m["_label"], m["world_size"])]
        parts = [stack_parts(r) for _, r in m.iterrows()]
        bottom = [0.0] * len(cats)
        for name, color in STACK:
            ys = [max(0.0, p[name]) for p in parts]
            ax.bar(range(len(cats)), ys, 0.6, bottom=bottom, label=name, color=color)
            bottom = [b + y for b, y in zip(bottom, ys)]
        ax.set_xticks(range(len(cats)), cats, fontsize="small")
        ax.set_xlim(-0.7, len(cats) - 0.3)
        ax.set_ylim(0, 1.05 * max(bottom))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.1f}"))
        ax.set(ylabel="ms per profiled step (mean over ranks)", title=f"Time per profiled step — model {model}")
        ax.grid(alpha=0.3, axis="y")
    handles, names = axes[0].get_legend_handles_labels()  # the same four parts in every panel
    fig.legend(handles, names, loc="outside lower center", fontsize="small", ncol=4)
    return fig


PLOTS = {"throughput": plot_throughput, "scaling_efficiency": plot_scaling_efficiency, "memory": plot_memory,
         "variants": plot_variants, "pp_microbatches": plot_pp_microbatches, "mfu": plot_mfu,
         "time_breakdown": plot_time_breakdown}


def make_plots(summary: pd.DataFrame, out_dir: str | Path | None = None, dpi: int = 120) -> dict:
    """All plots: {name: (Figure or None, note)}; PNGs written to out_dir/<name>.png if given."""
    out = {}
    for name, fn in PLOTS.items():
        try:
            fig = fn(summary)
        except NoDataError as e:
            out[name] = (None, f"skipped: {e}")
            continue
        note = ""
        if out_dir is not None:
            path = Path(out_dir) / f"{name}.png"
            fig.savefig(path, dpi=dpi, bbox_inches="tight")
            note = str(path)
        out[name] = (fig, note)
    return out

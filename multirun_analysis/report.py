"""report.md and the terminal table: what a reader needs to pick a strategy.

The report puts the ranked answer first (fastest completed strategy per model and GPU
count, with its memory cost), then the tables, plots, failed runs, data problems, the
environment the numbers were measured in, and the exact column definitions.
"""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

import pandas as pd

from multirun_analysis.planned import planned_section
from multirun_analysis.prediction import by_strategy, rank_correlation, report_section
from multirun_analysis import answer, breakdown, trust, versus
from multirun_analysis.tables import devices_word, fmt_value, md_table, table_rows
from multirun_analysis.summarize import DEFINITIONS

COMPACT = [("model", "model", str), ("label", "strategy", str), ("world_size", "GPUs", "{:g}"),
           ("n_runs", "n", "{:g}"), ("tokens_per_s", "tokens/s", "{:,.0f}"), ("time_s", "time s", "{:.3f}"),
           ("mem_peak_mb", "peak GiB", lambda v: _gib(v)), ("mfu", "MFU %", "pct"),
           ("scaling_efficiency_pct", "eff %", "{:.1f}"), ("overhead_pct", "overhead %", "{:+.1f}"),
           ("memory_ratio", "mem ×", "{:.2f}"), ("not_to_trust", "not to trust", str)]
SUMMARY_MD = COMPACT[:7] + [("mem_mean_mb", "mean GiB", lambda v: _gib(v)), ("mem_total_mb", "total GiB", lambda v: _gib(v)),
                            ("gpu_util_mean_pct", "util %", "{:.1f}"), ("mfu", "MFU %", "pct"),
                            ("tokens_per_s_min", "tokens/s min", "{:,.0f}"),
                            ("tokens_per_s_max", "tokens/s max", "{:,.0f}"), ("n_failed", "failed", "{:g}"),
                            COMPACT[-1]]
BASELINE_MD = [COMPACT[0], COMPACT[1], COMPACT[2], ("baseline_tokens_per_s", "baseline tokens/s", "{:,.0f}"),
               ("scaling_factor", "scaling ×", "{:.2f}"), ("scaling_efficiency_pct", "efficiency %", "{:.1f}"),
               ("overhead_pct", "overhead %", "{:+.1f}"), ("memory_ratio", "memory ×", "{:.2f}"),
               ("baseline_note", "note", str)]
OVERHEAD_MD = [("strategy", "strategy", str), ("impl", "impl", str), ("world_size", "GPUs", "{:g}"),
               ("n_runs", "runs", "{:g}"), ("startup_s", "startup s", "{:.1f}"), ("teardown_s", "teardown s", "{:.1f}"),
               ("fixed_overhead_s", "overhead s", "{:.1f}"), ("fixed_overhead_s_max", "max s", "{:.1f}"),
               ("setup_s", "rank-0 setup s", "{:.1f}"), ("setup_phases", "its parts (median)", str)]
FAILED_MD = [("status", "status", str), ("model", "model", str), ("strategy", "strategy", str),
             ("world_size", "GPUs", "{:g}"), ("reason", "reason", str), ("run_dir", "run", str)]


def _gib(mb) -> str:
    """A memory cell in GiB (the report's one unit); the tables keep MiB columns (*_mb) as measured."""
    return f"{float(mb) / 1024:,.2f}"


def compact_table(summary: pd.DataFrame) -> str:
    """The summary as a fixed-width terminal table."""
    heads, rows = table_rows(summary, COMPACT)
    if not rows:
        return "(no completed runs)"
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    text = {0, 1, len(heads) - 1} if heads[-1] == "not to trust" else {0, 1}
    line = lambda cells: "  ".join((c.ljust if i in text else c.rjust)(w[i]) for i, c in enumerate(cells)).rstrip()  # noqa
    return "\n".join([line(heads), line(["-" * x for x in w])] + [line(r) for r in rows])


def environment(runs: pd.DataFrame) -> list[str]:
    """Where and with what the runs were measured (unique values over runs)."""
    def uniq(col):
        if col not in runs.columns:
            return []
        return sorted({fmt_value(x) for x in runs[col].dropna() if str(x) not in ("", "None")})
    lines = []
    for col, name in (("prov.hostname", "hosts"), ("device_type", "device type"), ("prov.devices", "devices"),
                      ("prov.platform", "platform"), ("prov.cpu_count", "CPU count"),
                      ("prov.git_commit", "git commit"), ("prov.git_dirty", "git dirty")):
        lines.append(f"- {name}: {', '.join(uniq(col)) or 'n/a'}")
    dates = uniq("prov.date_utc")
    lines.append(f"- dates (UTC): {dates[0]} … {dates[-1]}" if dates else "- dates: n/a")
    vers = [c for c in runs.columns if c.startswith("prov.versions.")]
    lines.append("- versions: " + (", ".join(f"{c.split('.')[-1]} {'/'.join(uniq(c)) or 'n/a'}" for c in vers)
                                   or "n/a"))
    topos = uniq("prov.nvidia_smi_topo")
    lines.append("- topology (`nvidia-smi topo -m`): " + ("n/a (no NVIDIA GPU)" if not topos else ""))
    for t in topos:
        lines += ["", "```", re.sub(r"\x1b\[[0-9;]*m", "", t).rstrip(), "```"]  # nvidia-smi's ANSI bold
    return lines


DEFAULT_BEST_MD = [("model", "model", str), ("world_size", "GPUs", "{:g}"), ("tokens_per_step", "tokens/step", "{:,.0f}"),
                   ("strategy_id", "strategy", str), ("default_tokens_per_s", "default tokens/s", "{:,.0f}"),
                   ("best_tokens_per_s", "best tokens/s", "{:,.0f}"), ("gain", "gain ×", "{:.2f}"),
                   ("knobs_that_differ", "best differs in", str), ("best_mem_peak_mb", "best peak GiB", lambda v: _gib(v)),
                   ("layout", "best layout", str),
                   ("best_measured", "best measured over", str), ("n_settings", "settings run", "{:g}"),
                   ("not_to_trust", "not to trust", str)]
PREDICTION_MD = [("strategy", "strategy", str), ("runs", "runs", "{:g}"), ("median_error_pct", "median error %", "{:+.1f}"),
                 ("min_error_pct", "min %", "{:+.1f}"), ("max_error_pct", "max %", "{:+.1f}"),
                 ("within_10pct", "within ±10%", "{:g}"),
                 ("tokens_median_abs_error_pct", "throughput median abs error %", "{:.1f}")]
SPEARMAN_MD = [("device", "device", str), ("model", "model", str), ("world_size", "GPUs", "{:g}"),
               ("tokens_per_step", "tokens/step", "{:,.0f}"), ("layouts", "layouts", "{:g}"),
               ("spearman", "Spearman ρ", "{:+.2f}")]


def _head(inputs, runs, summary, failed) -> list[str]:
    n_ok = int(runs["usable"].astype(bool).sum()) if len(runs) else 0
    return ["# Benchmark analysis", "",
            f"Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC} from "
            + ", ".join(f"`{p}`" for p in inputs) + f": {len(runs)} run folder(s), {n_ok} usable, "
            f"{len(failed)} failed or incomplete, {len(summary)} experiment(s).", ""]


def dry_run_report(inputs, plans: pd.DataFrame, problems, memory_budget_gib=None) -> list[str]:
    """A folder of plans only: the predicted ranking first, and that nothing was measured."""
    return ["# Benchmark analysis: a dry run (predicted, nothing measured)", "",
            f"Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC} from "
            + ", ".join(f"`{p}`" for p in inputs) + f": {len(plans)} planned layout(s). No run was measured: "
            "every number below is a prediction. Run the top layouts (their commands are in the table) and "
            "analyse their folder together with this one for predicted beside measured.", ""] \
        + planned_section(plans, memory_budget_gib) + ["", "## Problems", ""] \
        + ([f"- `{d or '(input)'}`: {p}" for d, p in problems] or ["None."])


def prediction_md(prediction: pd.DataFrame, plots: dict) -> list[str]:
    """Prediction against measurement: the numbers, per strategy, the rank correlation per group, the scatter."""
    if prediction is None or not prediction["peak_error_pct"].notna().any():
        return []
    md = report_section(prediction) + [md_table(by_strategy(prediction), PREDICTION_MD)]
    rho = rank_correlation(prediction)
    if len(rho):
        md += ["Rank correlation per group (Spearman, pandas `corr(method=\"spearman\")`, over the group's layouts "
               "at their fastest measured run; 1 = the predicted order is the measured order):", "",
               md_table(rho, SPEARMAN_MD)]
    fig, note = plots.get("prediction", (None, "not drawn"))
    return md + (["![prediction](prediction.png)", ""] if fig is not None else [f"- prediction plot: {note}", ""])


def write_report(out_dir: Path, inputs, runs: pd.DataFrame, summary: pd.DataFrame, failed: pd.DataFrame,
                 plots: dict, problems: list[tuple[str, str]], overhead: pd.DataFrame | None = None,
                 memory_budget_gib: float | None = None, prediction: pd.DataFrame | None = None,
                 plans: pd.DataFrame | None = None, both: pd.DataFrame | None = None) -> Path:
    """Write report.md next to the tables and PNGs; returns its path."""
    path = Path(out_dir) / "report.md"
    if runs.empty and plans is not None and len(plans):
        path.write_text("\n".join(dry_run_report(inputs, plans, problems, memory_budget_gib)) + "\n")
        return path
    md = _head(inputs, runs, summary, failed) + [
          f"## Answer: the fastest strategy at its best settings, per model, {devices_word(summary)[:-1]} count and "
          "tokens per step", "",
          f"Runs of different models, {devices_word(summary)[:-1]} counts or tokens per step are never ranked together."
          + (f" Only strategies whose measured peak fits {memory_budget_gib:g} GiB per GPU are ranked."
             if memory_budget_gib else "")
          + f" A run is marked **not to trust** for {trust.THRESHOLDS}; each such run is listed under Problems.", ""]
    md += answer.ranked(summary, memory_budget_gib)
    if len(failed):
        md += ["", f"Not ranked: {len(failed)} run(s) that did not complete "
                   f"({', '.join(f'{k}: {v}' for k, v in failed['status'].value_counts().items())}); "
                   "see [Failed runs](#failed-and-incomplete-runs)."]
    md += ["", "## Each strategy at its defaults and at its best", "",
           "Default: every tuned knob at its schema default (tuning=default); best: the fastest completed setting "
           "of the same strategy and workload among those measured over the most timed steps (a setting measured "
           "more than once, e.g. at two rungs of a search, at its longest run; one measured only shorter is not "
           "ranked against them).", "", md_table(answer.default_vs_best(summary), DEFAULT_BEST_MD)]
    if both is not None and len(both):  # a dry run analysed with its measurement: one table, not two
        md += versus.section(both)
    elif plans is not None and len(plans):
        md += planned_section(plans, memory_budget_gib)
    md += prediction_md(prediction, plots)
    md += ["", "## Summary (median over repeats)", "", md_table(summary, SUMMARY_MD),
           "## Comparison with the single-device baseline", "", md_table(summary, BASELINE_MD), "## Plots", ""]
    for name, (fig, note) in ((k, v) for k, v in plots.items() if k != "prediction"):
        md += [f"![{name}]({name}.png)", ""] if fig is not None else [f"- {name}: {note}", ""]
    md += breakdown.report_section(summary, runs)  # profiled runs only
    if overhead is not None:
        md += ["## Fixed overhead per run", "",
               "What a run costs besides its training steps (medians over completed runs; definitions below):",
               "", md_table(overhead, OVERHEAD_MD)]
    md += ["## Failed and incomplete runs", "", md_table(failed, FAILED_MD), "## Problems", ""]
    md += [f"- `{d or '(input)'}`: {p}" for d, p in problems] or ["None."]
    md += ["", "## Environment", ""] + environment(runs)
    md += ["", "## Definitions", "", "```text", (DEFINITIONS or "").strip(), "```", "",
           "Files: `runs.csv`/`runs.parquet` (one row per run), `summary.csv` (one row per experiment), "
           "`fixed_overhead.csv`, `failed_runs.csv`, the PNG plots."]
    path.write_text("\n".join(md) + "\n")
    return path

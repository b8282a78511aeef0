"""Reduce runs to one row per experiment and compare each with the single-device baseline.

Why these definitions: they are the aggregates of appendix F of "Distributed Training Strategies on Commodity
Hardware" (Akbulut, Chowdhury, Gutierrez, Columbia University), computed
from what every rank recorded, so that strategies that count tokens or time differently
are still compared on the same footing.

Experiment (group key): every config column except ``seed``, the measurement settings
(``metrics.*``, and what a sweep leaves out of a run's key: ``dist_timeout_s``, ``run_timeout_s``,
``teardown_timeout_s``, ``start_method``, ``resume``, ...) and paths/commands, i.e. model x
strategy x every strategy knob x world_size x precision x compile x global_batch x seq_len
x steps ...  Runs that differ only in seed (or are plain repeats) are repeats.

Per run (columns of runs.csv, computed in load.py):
  tokens            = throughput.tokens_timed (tokens of the timed steps, by the strategy's
                      token rule: summed over ranks of each rank's counted tokens)
  time_s            = throughput.timed_window_s (= max over ranks of window_s: the slowest
                      rank sets the run's time; if absent, max of ranks[*].window_s, noted
                      as a problem)
  tokens_per_s      = tokens / time_s
  time_per_token_s  = time_s / tokens
  mem_mean_mb, mem_peak_mb, mem_total_mb
                    = mean, max, sum over ranks of ranks[r].max_allocated_mb (CUDA allocator
                      peak); when no rank has it (CPU) ranks[r].host_peak_rss_mb;
                      ``mem_source`` says which.

Per experiment (summary.csv; one row per experiment with >= 1 usable run), over its usable
(status completed, tokens and time present) repeats:
  <key columns>     the experiment's config values; ``label`` = strategy + the knobs that
                    split it (see variant_labels)
  n_runs, n_failed  usable repeats; runs of the same key that are not usable
  not_to_trust      the flags of its usable runs (few steps, spread, host busy; "(k of n runs)" where not
                    every repeat has it): multirun_analysis/trust.py says when a run is flagged
  command           the command the first usable repeat ran with (provenance)
  failed_statuses, seeds, device_type, mem_source: the distinct values, comma-joined
  tokens, time_s, tokens_per_s, step_time_median_s (step_time_s.median), mem_mean_mb,
  mem_peak_mb, mem_total_mb, gpu_util_mean_pct (utilization.gpu_util_mean_pct: mean over
  ranks), mfu (flops.mfu), mfu_vs_measured_peak, achieved_tflops_per_device, loss_last,
  joules_per_token, total_params (flops.total_params: the model's parameters), n_microbatches (layout.microbatches: the resolved micro-batch count of
  tp/pp/megatron runs, where the ``microbatches`` key column holds the setting: p, 4p, 8, ...),
  layout_tp, layout_pp, layout_dp, layout_micro_batch_size, layout_grad_accum (layout.*: the layout
  that ran, micro-batch size and accumulation steps resolved; multirun_analysis/layouts.py),
  startup_s, teardown_s, fixed_overhead_s (job.*: see fixed_overhead below), setup_s
  (rank 0's strategy setup), prof_compute_ms, prof_communication_ms, prof_overlapped_ms,
  prof_idle_ms, prof_wall_ms (profiled runs only, metrics.profile_steps > 0: per run the mean
  over ranks of profile[r].breakdown_ms_per_step, ms per profiled step, from each rank's trace;
  compute + communication - overlapped + idle = wall; bench/metrics/trace.py)
                    = median over repeats of the per-run value; ``*_min``/``*_max`` = min/max
                      over repeats (time_s, tokens_per_s, mem_peak_mb, mfu)
  tokens_per_s_per_device = tokens_per_s / world_size
  time_per_token_s  = 1 / tokens_per_s   (so it is consistent with the median throughput)

Baseline comparison (compare_to_baseline): the baseline of an experiment is the experiment
with strategy=single, world_size=1 and the same model, global_batch, seq_len, precision,
compile and device type (ties broken by the most equal other non-strategy knobs: steps,
optim, ...; then by most runs).  With b = baseline and N = world_size:
  baseline_tokens_per_s, baseline_time_per_token_s, baseline_mem_peak_mb = b's values
  scaling_factor         = tokens_per_s / b.tokens_per_s
  scaling_efficiency_pct = 100 * scaling_factor / N
  overhead_pct           = 100 * (time_per_token_s * N / b.time_per_token_s - 1)
                         = 100 * (N / scaling_factor - 1): the extra device-seconds per token
                           relative to one device (0 = perfect scaling, 100 = twice the
                           device time; negative = superlinear)
  memory_ratio           = mem_peak_mb / b.mem_peak_mb  (per-device peak vs the baseline's)
No baseline: these columns are NaN and ``baseline_note`` says why (also listed as a problem).

Fixed overhead per run (fixed_overhead; the cost of a run that is not training steps), over the
usable runs of each strategy (and impl) x world_size, median (max for the overhead):
  startup_s         = job.startup_s: job start -> rank 0's first step (launch, imports, CUDA and
                      process-group init, the matmul-peak measurement, strategy setup)
  teardown_s        = job.teardown_s: rank 0's last step -> results written (profiled steps,
                      gathering, process exit)
  fixed_overhead_s  = job.overhead_s = startup_s + teardown_s
  outside_steps_s   = job.outside_steps_s = fixed_overhead_s + the warm-up's time beyond its steps at the
                      timed median step (compilation, CUDA graph capture): what the run cost that was not steps
  setup_s           = rank0.setup_s: rank 0's strategy setup (part of startup_s)
  setup_phases      = the median of each named part of that setup (rank0.setup_phases_s.*) and of
                      start-up before it (rank0.startup_phases_s.*), largest first
"""
from __future__ import annotations

import json
import math
from typing import Iterable, Optional

import pandas as pd

from bench.run.runs import volatile_keys
from bench.strategies.registry import baseline_name
from multirun_analysis import breakdown, trust
from multirun_analysis.load import SHORTHANDS, config_columns
from multirun_analysis.tables import fmt_value, key_columns, plain

DEFINITIONS = __doc__  # the exact column definitions, also printed into report.md
# bookkeeping, not what ran: the keys a sweep's run key leaves out too (deadlines, resume, ...), and
# seeds, whose runs are repeats of one experiment
# a shorthand's name (zero_stage, microbatches) is the column of the strategy key it sets (load.py)
EXCLUDED_FROM_KEY = ("seed", "command") + tuple(k for k in volatile_keys() if k not in SHORTHANDS)
EXCLUDED_PREFIXES = ("metrics.", "hydra.", "cfg.metrics.", "vars.", "fault.", "logger.", "hardware.")
BASELINE = {"strategy": baseline_name(), "world_size": 1}
BASELINE_MATCH = ("model", "global_batch", "seq_len", "precision", "compile", "device_type")
COMPARISON = ("baseline_tokens_per_s", "baseline_time_per_token_s", "baseline_mem_peak_mb",
              "scaling_factor", "scaling_efficiency_pct", "overhead_pct", "memory_ratio", "baseline_note")
# summary column <- runs column, median over repeats (+ min/max where True)
MEASURES = {
    "tokens": ("tokens", False), "time_s": ("time_s", True), "tokens_per_s": ("tokens_per_s", True),
    "step_time_median_s": ("step_time_s.median", False), "mem_mean_mb": ("mem_mean_mb", False),
    "mem_peak_mb": ("mem_peak_mb", True), "mem_total_mb": ("mem_total_mb", False),
    "gpu_util_mean_pct": ("utilization.gpu_util_mean_pct", False), "mfu": ("flops.mfu", True),
    "mfu_vs_measured_peak": ("flops.mfu_vs_measured_peak", False),
    "achieved_tflops_per_device": ("flops.achieved_tflops_per_device", False),
    "loss_last": ("loss.last", False), "joules_per_token": ("energy.joules_per_token", False),
    "total_params": ("flops.total_params", False),
    "n_microbatches": ("layout.microbatches", False),
    **{f"layout_{k}": (f"layout.{k}", False) for k in ("tp", "pp", "dp", "cp", "micro_batch_size", "grad_accum")},
    "startup_s": ("job.startup_s", False), "teardown_s": ("job.teardown_s", False),
    "fixed_overhead_s": ("job.overhead_s", True), "setup_s": ("rank0.setup_s", False),
    "outside_steps_s": ("job.outside_steps_s", False),
    **breakdown.MEASURES,  # prof_<part>_ms: profiled runs' time breakdown (multirun_analysis/breakdown.py)
}


def experiment_key(runs: pd.DataFrame) -> list[str]:
    """The config columns that define an experiment (see module docstring)."""
    return [c for c in config_columns(runs)
            if c not in EXCLUDED_FROM_KEY and not c.startswith(EXCLUDED_PREFIXES)]


def _key_strings(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    """One JSON string per row: a group key where NaN == NaN and types do not matter to pandas."""
    return pd.Series([json.dumps([plain(v) for v in vals], default=str)
                      for vals in df[cols].itertuples(index=False, name=None)], index=df.index, dtype=object)


def _col(g: pd.DataFrame, c: str) -> pd.Series:
    return pd.to_numeric(g[c], errors="coerce") if c in g.columns else pd.Series([math.nan] * len(g))


def _joined(xs: Iterable) -> Optional[str]:
    vals = sorted({str(plain(x)) for x in xs if plain(x) is not None})
    return ", ".join(vals) if vals else None


def summarize(runs: pd.DataFrame, compare: bool = True, baseline: dict | None = None) -> pd.DataFrame:
    """One row per experiment with at least one usable run (the rest: failed_runs).

    Column definitions: ``multirun_analysis.DEFINITIONS``.
    """
    key = experiment_key(runs)
    groups = _key_strings(runs, key) if key else pd.Series("", index=runs.index, dtype=object)
    recs = []
    for _, g in runs.groupby(groups, sort=False):
        ok = g[g["usable"].astype(bool)]
        if ok.empty:
            continue
        rec = {k: plain(g[k].iloc[0]) for k in key}
        bad = g[~g["usable"].astype(bool)]
        rec.update(n_runs=len(ok), n_failed=len(bad), failed_statuses=_joined(bad["status"]),
                   seeds=_joined(ok["seed"]) if "seed" in ok else None,
                   device_type=_joined(ok["device_type"]), mem_source=_joined(ok["mem_source"]),
                   not_to_trust=trust.of_runs(ok["not_to_trust"]) if "not_to_trust" in ok else None,
                   grad_reduce=_joined(ok["layout.grad_reduce"]) if "layout.grad_reduce" in ok else None,
                   command=ok["prov.command"].dropna().iloc[0] if "prov.command" in ok and ok["prov.command"].notna().any()
                   else None)
        for name, (src, minmax) in MEASURES.items():
            x = _col(ok, src)
            rec[name] = x.median()
            if minmax:
                rec[name + "_min"], rec[name + "_max"] = x.min(), x.max()
        ws = pd.to_numeric(pd.Series([rec.get("world_size")]), errors="coerce").iloc[0]
        rec["tokens_per_s_per_device"] = rec["tokens_per_s"] / ws if ws and ws > 0 else math.nan
        rec["time_per_token_s"] = 1.0 / rec["tokens_per_s"] if rec["tokens_per_s"] > 0 else math.nan
        recs.append(rec)
    cols = key + ["n_runs", "n_failed", "failed_statuses", "seeds", "device_type", "mem_source", "not_to_trust",
                  "grad_reduce", "command"]
    s = pd.DataFrame.from_records(recs) if recs else pd.DataFrame(columns=cols + list(MEASURES))
    s.attrs.update(key_columns=key, **{k: runs.attrs.get(k, []) for k in ("model_columns", "strategy_columns")})
    s.insert(len(key), "label", variant_labels(s))
    if compare:
        s = compare_to_baseline(s, baseline)
    order = [c for c in ("model", "world_size", "strategy", "label") if c in s.columns]
    if order and len(s):
        s = s.sort_values(order, kind="stable", key=lambda c: c.map(str) if c.name != "world_size" else c)
    return s.reset_index(drop=True)


def _same(a, b) -> bool:
    a, b = plain(a), plain(b)
    return a == b or (a is None and b is None)


def compare_to_baseline(summary: pd.DataFrame, baseline: dict | None = None,
                        match: Iterable[str] = BASELINE_MATCH) -> pd.DataFrame:
    """Add scaling factor/efficiency, overhead and memory ratio vs the baseline experiment.

    ``baseline`` selects the baseline rows (default strategy=single, world_size=1); ``match``
    are the columns a baseline must share with the experiment.  Missing baseline -> NaN.
    """
    s = summary.copy()
    base_sel = dict(BASELINE if baseline is None else baseline)
    match = [c for c in match if c in s.columns]
    skip = set(match) | set(base_sel) | {"strategy", "world_size"} | set(s.attrs.get("strategy_columns", []))
    prefer = [c for c in key_columns(s) if c not in skip]
    is_base = pd.Series(True, index=s.index)
    for k, v in base_sel.items():
        is_base &= s[k].map(lambda x: _same(x, v)) if k in s.columns else False
    bases = s[is_base]
    out = {c: [] for c in COMPARISON}
    what = " ".join(f"{k}={v}" for k, v in base_sel.items())
    for _, row in s.iterrows():
        cand = bases[[all(_same(b[c], row[c]) for c in match) for _, b in bases.iterrows()]] if len(bases) else bases
        note = None
        if cand.empty:
            b = None
            note = f"no completed {what} run with the same {', '.join(match)}"
        else:
            score = [sum(_same(b[c], row[c]) for c in prefer) for _, b in cand.iterrows()]
            best = cand[[x == max(score) for x in score]]
            b = best.sort_values("n_runs", ascending=False, kind="stable").iloc[0]
            if len(best) > 1:
                note = f"{len(best)} candidate baselines; took the one with most runs"
        tps, ws = row["tokens_per_s"], pd.to_numeric(pd.Series([row.get("world_size")]), errors="coerce").iloc[0]
        btps = b["tokens_per_s"] if b is not None else math.nan
        sf = tps / btps if btps and btps > 0 else math.nan
        bmem = b["mem_peak_mb"] if b is not None else math.nan
        out["baseline_tokens_per_s"].append(btps)
        out["baseline_time_per_token_s"].append(1 / btps if btps and btps > 0 else math.nan)
        out["baseline_mem_peak_mb"].append(bmem)
        out["scaling_factor"].append(sf)
        out["scaling_efficiency_pct"].append(100 * sf / ws if ws and ws > 0 else math.nan)
        out["overhead_pct"].append(100 * (row["time_per_token_s"] * ws / (1 / btps) - 1)
                                   if btps and btps > 0 and ws and ws > 0 else math.nan)
        out["memory_ratio"].append(row["mem_peak_mb"] / bmem if bmem and bmem > 0 else math.nan)
        out["baseline_note"].append(note)
    for c in COMPARISON:
        s[c] = pd.Series(out[c], index=s.index, dtype=object if c == "baseline_note" else float)
    return s


def variant_labels(s: pd.DataFrame, exclude: Iterable[str] = ()) -> pd.Series:
    """A short name per experiment: the strategy plus the knobs that split it.

    A column is shown for a strategy when, within one model and world size, that strategy
    has several values of it (zero_stage=1/2/3); a knob that only follows world_size
    (tp = world_size) does not split a line and is not shown, nor are null/"none" values
    (offload_optimizer=none).
    """
    if s.empty:
        return pd.Series([], dtype=object)
    drop = {"model", "strategy", "world_size", *exclude}
    cand = [c for c in key_columns(s) if c not in drop]
    labels = pd.Series([str(plain(x)) for x in s.get("strategy", pd.Series("?", index=s.index))],
                       index=s.index, dtype=object)
    mcol = s["model"].map(fmt_value) if "model" in s else pd.Series("", index=s.index)
    scol = s["strategy"].map(fmt_value) if "strategy" in s else pd.Series("", index=s.index)
    wcol = s["world_size"].map(fmt_value) if "world_size" in s else pd.Series("", index=s.index)
    for (_, _), g in s.groupby([mcol, scol], sort=False):
        split = [c for c in cand if _key_strings(g, [c]).groupby(wcol[g.index]).nunique().max() > 1]
        for i in g.index:
            extra = [f"{c}={fmt_value(g.at[i, c])}" for c in split if plain(g.at[i, c]) not in (None, "none")]
            if extra:
                labels[i] += " " + " ".join(extra)
    return labels


def failed_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run that is not usable (oom, failed, invalid, timeout, interrupted, incomplete)."""
    cols = ["status", "reason", "model", "strategy", "world_size", "device", "device_type", "precision", "overrides",
            "error_type",
            "error_message", "status_json", "problems", "run_dir"]
    f = runs[~runs["usable"].astype(bool)] if len(runs) else runs
    return f[[c for c in cols if c in f.columns]].reset_index(drop=True)


def fixed_overhead(runs: pd.DataFrame) -> pd.DataFrame:
    """Start-up and teardown cost per strategy (and impl) and world size (see DEFINITIONS)."""
    ok = runs[runs["usable"].astype(bool)] if len(runs) else runs
    by = [c for c in ("strategy", "impl", "world_size") if c in ok.columns]
    phases = [c for c in ok.columns if c.startswith(("rank0.startup_phases_s.", "rank0.setup_phases_s."))]
    recs = []
    for keys, g in (ok.groupby([ok[c].map(fmt_value) if c != "world_size" else ok[c] for c in by], sort=True)
                    if len(ok) and by else []):
        rec = dict(zip(by, keys if isinstance(keys, tuple) else (keys,)))
        over = _col(g, "job.overhead_s")
        rec.update(n_runs=len(g), startup_s=_col(g, "job.startup_s").median(),
                   teardown_s=_col(g, "job.teardown_s").median(), fixed_overhead_s=over.median(),
                   fixed_overhead_s_max=over.max(), outside_steps_s=_col(g, "job.outside_steps_s").median(),
                   setup_s=_col(g, "rank0.setup_s").median(),
                   device_type=_joined(g["device_type"]) if "device_type" in g else None)
        med = {c.split(".", 2)[2]: _col(g, c).median() for c in phases}
        med = sorted(((v, k) for k, v in med.items() if not math.isnan(v)), reverse=True)
        rec["setup_phases"] = ", ".join(f"{k} {v:.1f} s" for v, k in med) or None
        recs.append(rec)
    cols = by + ["n_runs", "startup_s", "teardown_s", "fixed_overhead_s", "fixed_overhead_s_max", "outside_steps_s",
                 "setup_s", "setup_phases", "device_type"]
    return pd.DataFrame.from_records(recs, columns=cols)

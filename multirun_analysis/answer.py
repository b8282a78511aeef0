"""The answer: which strategy to use, at its best settings, as a command line.

* Runs are compared only within one **workload**: the same model, GPU count and tokens per
  optimizer step (global batch x sequence length).  Runs of different workloads are never ranked
  against each other.
* A strategy's **identity** is what the experiment key holds except the knobs a search tunes
  (every knob declared with search candidates in bench's schemas, compile, tuning) and the run length
  (steps, warmup_steps): ZeRO-1 and
  ZeRO-3, or Megatron TP=2 and PP=2, are different strategies; ZeRO-1 with and without CUDA graphs
  are one strategy at two settings.  Per strategy: its **default** (every tuned knob at its schema
  default, tuning=default) beside its **best** (the fastest of the settings measured over the most
  timed steps, each setting at its longest measurement: a search's later rung re-measures it), the
  gain and the knobs that differ.
* **Ties**: a strategy whose best setting's repeats overlap the winner's (its fastest run is at least
  the winner's slowest; both measured at least twice) is marked a tie: the order between them is
  run-to-run noise (one program measured three times on one H200 spread +-2.2%, repeats of one
  host-bound setting 10%: results/2026-11-25-h200-search-1gpu).  With one run the spread is unknown
  and nothing is marked.
* **Precision** is part of a strategy's identity: an fp8 run (torchao float8 matmuls) is its own row,
  labelled ``precision=fp8`` (and its recipe), beside the same strategy in bf16, and a workload whose
  ranking mixes them says so (float8 computes a numerically different thing; compare the losses too).
* **Gradient sums**: a workload whose bests sum gradients at different precisions (``layout.grad_reduce``: ZeRO's
  DeepSpeed bf16 against the others' fp32) says so, and names ``grad_reduce`` to rank them at one.
* ``memory_budget_gib``: only runs whose measured peak per device (mem_peak_mb: the CUDA allocator's
  peak, or host RSS on CPU) fits are ranked; the others are listed with their peak.
* **Not to trust**: a best whose runs are flagged (multirun_analysis/trust.py: few timed steps, a large spread of
  step times, a busy host) keeps its place by its number but says so, and where the winner is flagged the
  fastest strategy whose best is not flagged is named beside it.
* The winner's command: the command it ran with (provenance), as the ``python -m bench ...`` that runs
  its setting once (bench.spec.commands.rerun_command: without the sweep's or search's machinery).
"""
from __future__ import annotations

import math
import shlex
from typing import Optional

import pandas as pd

from bench.spec.commands import rerun_command
from bench.units import count_text
from bench.strategies.registry import knob_text, specs
from bench.spec.schema import BenchConfig, fields_of
from multirun_analysis import layouts
from multirun_analysis.tables import devices_word, fmt_value, key_columns, plain

WORKLOAD = ("model", "world_size", "tokens_per_step")
FLOAT8 = "fp8"  # the precision whose runs are named apart and flagged when ranked beside 16-bit ones
RUN_LENGTH = ("steps", "warmup_steps")  # how long a setting was measured, not what it is


def tuned_knobs() -> dict[str, object]:
    """Column -> schema default of every knob a search tunes (flattened names as in the runs table)."""
    out: dict[str, object] = {"tuning": "default"}
    for name, f in fields_of(BenchConfig).items():
        if f.metadata.get("tune"):
            out[name] = f.default
    for spec in specs().values():
        for name, f in fields_of(spec.schema).items():
            if f.metadata.get("tune"):
                out[name] = f.default
    return out


def with_workload(summary: pd.DataFrame) -> pd.DataFrame:
    s = summary.copy()
    gb = pd.to_numeric(s.get("global_batch"), errors="coerce")
    seq = pd.to_numeric(s.get("seq_len"), errors="coerce")
    s["tokens_per_step"] = gb * seq
    return s


def _identity_cols(s: pd.DataFrame) -> list[str]:
    tuned = tuned_knobs()
    return [c for c in key_columns(s) if c not in tuned and c not in WORKLOAD + RUN_LENGTH
            and c not in ("global_batch", "seq_len")]


def _timed_steps(g: pd.DataFrame) -> pd.Series:
    return pd.to_numeric(g.get("steps"), errors="coerce").fillna(0) - \
        pd.to_numeric(g.get("warmup_steps"), errors="coerce").fillna(0)


def _longest_per_setting(g: pd.DataFrame, tuned: dict) -> pd.DataFrame:
    """One row per setting (the tuned knobs' values): the one measured over the most timed steps (a
    search's later rung re-measures its survivors for longer; that number replaces the short one)."""
    timed = _timed_steps(g)
    setting = pd.DataFrame({c: g[c].map(fmt_value) for c in tuned if c in g.columns}, index=g.index)
    order = timed.sort_values(ascending=False, kind="stable").index
    return g.loc[order][~setting.loc[order].duplicated()] if len(setting.columns) else g


def _best(g: pd.DataFrame) -> pd.Series:
    """The fastest of the settings measured over the most timed steps: a setting measured only over
    fewer (a search's first rung: one short run) is not ranked against them, where host jitter alone
    moves a short run by more than the differences a search separates.  The knob search's winner
    (bench.sweep.search.winner) is chosen by the same rule, so tune.json and this report agree."""
    timed = _timed_steps(g)
    return g[timed == timed.max()].sort_values("tokens_per_s", ascending=False).iloc[0]


def _is_default(row: pd.Series, tuned: dict) -> bool:
    for col, default in tuned.items():
        if col in row.index and plain(row[col]) is not None and plain(row[col]) != default:
            return False
    return True


def _strategy_name(row: pd.Series, cols: list[str]) -> str:
    """The strategy's own words for its varying knobs (StrategySpec.label), then the layout and recompute."""
    name = str(row.get("strategy"))
    varying = {c: plain(row.get(c)) for c in cols if c not in ("strategy", "model", "world_size")}
    spec = specs().get(name)
    parts = spec.label(name, varying) if spec is not None else [name]
    for c in ("tp", "pp", "cp"):
        if varying.get(c) not in (None, 1):
            parts.append(f"{c}={knob_text(varying[c])}")
    if varying.get("recompute") not in (None, "none"):
        parts.append(f"recompute={varying['recompute']}")
    if varying.get("precision") == FLOAT8:  # never one name with the same strategy's bf16 runs
        parts.append(f"precision={FLOAT8} fp8_recipe={varying.get('fp8_recipe') or 'tensorwise'}")
    return " ".join(parts)


def default_vs_best(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per workload and strategy: default and best settings side by side."""
    if summary.empty:
        return pd.DataFrame()
    s = with_workload(summary)
    tuned = tuned_knobs()
    ident = _identity_cols(s)
    rows = []
    groups = s.groupby([s[c].map(fmt_value) for c in WORKLOAD + tuple(ident) if c in s.columns], sort=False, dropna=False)
    for _, g in groups:
        g = _longest_per_setting(g, tuned).sort_values("tokens_per_s", ascending=False)
        best = _best(g)
        defaults = g[[_is_default(r, tuned) for _, r in g.iterrows()]]
        d = defaults.iloc[0] if len(defaults) else None
        differ = [f"{c}={fmt_value(best[c])}" for c in tuned if c in g.columns and d is not None
                  and plain(best[c]) != plain(d[c])]
        rows.append({**{c: best.get(c) for c in WORKLOAD}, "strategy_id": _strategy_name(best, ident),
                     "precision": best.get("precision"), "layout": layouts.text(layouts.of_summary_row(best)),
                     "default_tokens_per_s": d["tokens_per_s"] if d is not None else math.nan,
                     "best_tokens_per_s": best["tokens_per_s"], "best_label": best.get("label"),
                     "best_tokens_per_s_min": best.get("tokens_per_s_min", math.nan),
                     "best_tokens_per_s_max": best.get("tokens_per_s_max", math.nan), "best_n_runs": best.get("n_runs"),
                     "gain": best["tokens_per_s"] / d["tokens_per_s"] if d is not None else math.nan,
                     "knobs_that_differ": ", ".join(differ) if d is not None else "(no default run)",
                     "best_mem_peak_mb": best.get("mem_peak_mb"), "best_mfu": best.get("mfu"),
                     "command": best.get("command"), "n_settings": len(g),
                     "not_to_trust": best.get("not_to_trust"), "device_type": best.get("device_type"),
                     "total_params": best.get("total_params"), "grad_reduce": best.get("grad_reduce"),
                     "best_measured": f"{_timed_steps(g.loc[[best.name]]).iloc[0]:.0f} timed steps x "
                                      f"{fmt_value(best.get('n_runs'))} run(s)"})
    return pd.DataFrame(rows)


def ties_with(r: pd.Series, w: pd.Series) -> bool:
    """Whether ``r``'s best and the winner ``w``'s best are within each other's run-to-run spread: both
    measured over at least two runs, and r's fastest run at least w's slowest."""
    twice = _num(r.get("best_n_runs")) >= 2 and _num(w.get("best_n_runs")) >= 2
    return bool(twice and _num(r.get("best_tokens_per_s_max")) >= _num(w.get("best_tokens_per_s_min")))


def command_line(cmd: Optional[str]) -> Optional[str]:
    """A run's recorded command as ``python -m bench ...`` that runs its setting once (bench.spec.commands.rerun_command:
    no interpreter path, no sweep or search machinery)."""
    if not cmd or not isinstance(cmd, str):
        return None
    words = shlex.split(cmd)
    if "-m" in words:
        words = words[words.index("-m") + 2:]
    return rerun_command(words)


def ranked(summary: pd.DataFrame, memory_budget_gib: Optional[float] = None) -> list[str]:
    """Per workload: strategies at their best, fastest first; default vs best; what does not fit."""
    if summary.empty:
        return ["No run completed: nothing to rank."]
    table = default_vs_best(summary)
    out = []
    for keys, g in table.groupby([table[c].map(fmt_value) for c in WORKLOAD], sort=True):
        model, ws, tps = keys
        budget = memory_budget_gib * 1024 if memory_budget_gib else None
        fits = g if budget is None else g[pd.to_numeric(g["best_mem_peak_mb"], errors="coerce") <= budget]
        over = g.drop(fits.index)
        fits = fits.sort_values("best_tokens_per_s", ascending=False)
        size = _num(g["total_params"].max()) if "total_params" in g else math.nan
        head = (f"**{model}{f' ({count_text(size)} parameters)' if size > 0 else ''}, {devices_word(g, float(ws))}, "
                f"{tps} tokens per step**")
        if fits.empty:
            out.append(f"- {head}: no strategy fits {memory_budget_gib:g} GiB per GPU.")
        else:
            w = fits.iloc[0]
            tied = [r["strategy_id"] for _, r in fits.iloc[1:].iterrows() if ties_with(r, w)]
            out.append(f"- {head}: use **{w['strategy_id']}** ({w['best_label']}{_layout(w)}), "
                       f"{w['best_tokens_per_s']:,.0f} "
                       f"tokens/s, peak {_mib(w['best_mem_peak_mb'])} per device"
                       + (f" (within {memory_budget_gib:g} GiB)" if budget else "")
                       + (f"; ties with {', '.join(tied)} (the repeats overlap: their order is run-to-run noise)"
                          if tied else "") + _distrust(w) + _trusted_instead(w, fits) + ":")
            cmd = command_line(w["command"])
            if cmd:
                out += ["", "  ```bash", f"  {cmd}", "  ```", ""]
            for i, (_, r) in enumerate(fits.iterrows(), start=1):
                gain = (f"default {r['default_tokens_per_s']:,.0f} -> best {r['best_tokens_per_s']:,.0f} "
                        f"({r['gain']:.2f}x; {r['knobs_that_differ'] or 'the default is the best'})"
                        if not math.isnan(r["default_tokens_per_s"]) else
                        f"best {r['best_tokens_per_s']:,.0f} (no default run to compare)")
                tie = " (a tie: its repeats overlap the winner's)" if i > 1 and r["strategy_id"] in tied else ""
                pct = 100 * r["best_tokens_per_s"] / w["best_tokens_per_s"]
                out.append(f"    {i}. {r['strategy_id']}: {pct:.0f}% of the winner{tie}; {gain}; peak "
                           f"{_mib(r['best_mem_peak_mb'])}; measured over {r['best_measured']}"
                           + (f" ({_layout(r)[2:]})" if _layout(r) else "") + _distrust(r))
        for _, r in over.iterrows():
            out.append(f"    - does not fit {memory_budget_gib:g} GiB: {r['strategy_id']} (peak "
                       f"{_mib(r['best_mem_peak_mb'])})")
        out += _precision_note(g) + _reduction_note(fits)
    return out


def _distrust(r: pd.Series) -> str:
    """"; not to trust: <flags>" of a ranked row whose best run(s) are flagged (multirun_analysis/trust.py), else ""."""
    f = r.get("not_to_trust")
    return f"; **not to trust: {f}** (see Problems)" if isinstance(f, str) and f else ""


def _trusted_instead(w: pd.Series, fits: pd.DataFrame) -> str:
    """Where the winner is flagged: the fastest strategy whose best is not, and its share of the winner."""
    if not _distrust(w):
        return ""
    ok = [r for _, r in fits.iterrows() if not _distrust(r)]
    if not ok:
        return "; no strategy of this workload was measured without a flag"
    r = ok[0]
    return f"; the fastest not flagged: {r['strategy_id']} ({100 * r['best_tokens_per_s'] / w['best_tokens_per_s']:.0f}%)"


def _precision_note(g: pd.DataFrame) -> list[str]:
    """A workload ranked with fp8 rows beside others: they are the same model and tokens, not the same arithmetic."""
    prec = g["precision"].map(fmt_value) if "precision" in g.columns else pd.Series(dtype=object)
    if not ((prec == FLOAT8).any() and (prec != FLOAT8).any()):
        return []
    return [f"    - note: the precision={FLOAT8} rows run torchao float8 matmuls: the same model and tokens, a "
            f"numerically different computation; compare their loss with the {', '.join(sorted(set(prec) - {FLOAT8}))} "
            "rows' before taking their speed"]


def _reduction_note(g: pd.DataFrame) -> list[str]:
    """A workload whose ranked bests sum gradients at different precisions (layout.grad_reduce): on a slow link that
    alone can order them (bench/planner/reduction.py), so the ranking says so and how to run them at one."""
    kinds: dict[str, list[str]] = {}
    for _, r in g.iterrows():
        if "grad_reduce" in r and isinstance(plain(r["grad_reduce"]), str):
            kinds.setdefault(plain(r["grad_reduce"]), []).append(r["strategy_id"])
    if len(kinds) < 2:
        return []
    said = "; ".join(f"in {k} by {', '.join(v)}" for k, v in sorted(kinds.items()))
    return [f"    - note: gradients are summed {said}: the ranking compares different precisions of the gradient "
            "sums; with grad_reduce=fp32 or grad_reduce=16bit every strategy sums at one"]


def _layout(r: pd.Series) -> str:
    """``; <layout>, <precision>`` of a ranked row (multirun_analysis/layouts.py), the parts that are known; "" when
    none is (a summary without layout columns)."""
    lay, prec = r.get("layout"), r.get("precision")
    parts = [str(lay)] if isinstance(lay, str) and "?" not in lay else []
    parts += [fmt_value(prec)] if plain(prec) is not None else []
    return "; " + ", ".join(parts) if parts else ""


def _num(x) -> float:
    """A table cell as a number (NaN where it is none)."""
    return float(pd.to_numeric(x, errors="coerce"))


def _mib(x) -> str:
    x = _num(x)
    return "n/a" if math.isnan(x) else f"{x / 1024:,.1f} GiB"

"""A run's layout as the analysis names it: tp, pp, dp (and cp where context parallelism splits the sequence),
micro-batch size, accumulation steps, recompute, precision and the strategy's variant, from a measured run, a re-plan
or a dry run's plan.

Why one module: prediction.csv, the dry-run ranking, the measured answer and the side-by-side table must name
one layout the same way, or a predicted row and its measurement are never matched.  Accumulation is the
micro-batches a rank runs per optimizer step (gradient accumulation, or a pipeline's micro-batches).
"""
from __future__ import annotations

from typing import Optional

from multirun_analysis.tables import fmt_value, plain

COLUMNS = ["variant", "tp", "pp", "dp", "micro_batch_size", "grad_accum", "recompute", "precision"]
FLOAT8 = "fp8"


def variant(strategy: dict) -> str:
    """The strategy as the measured analysis names it (StrategySpec.label: ZeRO's stage, offloads), so that a
    dry run's rows (a search's four ZeRO stages among them) tell apart what the measured report does."""
    from bench.strategies.registry import get_spec

    name = str(strategy.get("name"))
    try:
        return " ".join(get_spec(name).label(name, strategy))
    except (KeyError, ValueError):  # a strategy this code no longer knows: its recorded name
        return name


def _first(*xs):
    return next((plain(x) for x in xs if plain(x) is not None), None)


def precision_of(cfg: dict) -> Optional[str]:
    """bf16 / fp32 / fp8 (with its recipe): fp8 and bf16 rows of one strategy are never one row."""
    p = cfg.get("precision")
    return f"{p} {cfg.get('fp8_recipe') or 'tensorwise'}" if p == FLOAT8 else p


def from_plan_layout(cfg: dict, lay: dict) -> dict:
    """The layout of a dry run's plan (its memory plan's ``layout``) or of a re-planned run."""
    return {"variant": variant(cfg.get("strategy") or {}), "tp": lay.get("tp"), "pp": lay.get("pp"),
            "dp": lay.get("dp"), "cp": lay.get("cp", 1), "micro_batch_size": lay.get("micro_batch_size"),
            "grad_accum": lay.get("microbatches"),
            "recompute": _offloaded(lay.get("recompute") or cfg.get("recompute"), lay.get("offload_activations")),
            "precision": precision_of(cfg)}


def _offloaded(recompute, offload) -> Optional[str]:
    """The recompute column, ``+offload`` where the blocks' saved tensors went to host memory (offload_activations):
    what a layout keeps of its activations, and where."""
    return f"{recompute}+offload" if offload and recompute is not None else recompute


def from_record(m: dict, plan=None) -> dict:
    """The layout a measured run ran (metrics.json ``layout``), completed from its re-plan where the record is
    older and lacks a field; what ran wins over what the current code would plan."""
    cfg, lay = m.get("config") or {}, m.get("layout") or {}
    st = cfg.get("strategy") or {}
    ws = cfg.get("world_size") or (m.get("run") or {}).get("world_size")
    tp = _first(lay.get("tp"), getattr(plan, "tp", None), st.get("tp"), 1)
    pp = _first(lay.get("pp"), getattr(plan, "pp", None), st.get("pp"), 1)
    cp = _first(lay.get("cp"), getattr(plan, "cp", None), st.get("cp"), 1)
    dp = _first(lay.get("dp"), getattr(plan, "dp_size", None), ws // (tp * pp * cp) if ws else None)
    return {"variant": variant(st) if st else (m.get("run") or {}).get("strategy"), "tp": tp, "pp": pp, "dp": dp,
            "cp": cp,
            "micro_batch_size": _first(lay.get("micro_batch_size"), getattr(plan, "micro_batch_size", None)),
            "grad_accum": _first(lay.get("grad_accum"), lay.get("microbatches"), getattr(plan, "grad_accum", None)),
            "recompute": _offloaded(_first(cfg.get("recompute"), str(lay.get("recompute") or "").split(":")[0] or None),
                                    cfg.get("offload_activations")),
            "precision": precision_of(cfg) or (m.get("run") or {}).get("precision")}


def text(r) -> str:
    """``tp=2 pp=1 dp=2 mb=8x1 rc=none``: micro-batch size x accumulation steps, recompute; ``cp=4`` after dp where
    context parallelism splits the sequence (cp > 1)."""
    g = lambda k: fmt_value(r.get(k)) if plain(r.get(k)) is not None else "?"  # noqa: E731
    cp = f" cp={g('cp')}" if (plain(r.get("cp")) or 1) != 1 else ""
    return (f"tp={g('tp')} pp={g('pp')} dp={g('dp')}{cp} mb={g('micro_batch_size')}x{g('grad_accum')} "
            f"rc={g('recompute')}")


def ident(r) -> str:
    """One layout within a workload: variant, layout and precision (the winner check's and the matching unit)."""
    return f"{r.get('variant')} {text(r)} {r.get('precision')}"


def of_summary_row(r) -> dict:
    """A summary row's layout (summarize.py's layout_* medians; older runs: the strategy's tp / pp keys)."""
    get = lambda *cs: _first(*(r.get(c) for c in cs))  # noqa: E731
    return {"tp": get("layout_tp", "tp") or 1, "pp": get("layout_pp", "pp") or 1, "dp": get("layout_dp"),
            "cp": get("layout_cp", "cp") or 1,
            "micro_batch_size": get("layout_micro_batch_size"), "grad_accum": get("layout_grad_accum", "n_microbatches"),
            "recompute": get("recompute"), "precision": get("precision")}

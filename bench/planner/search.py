"""The planner's search: strategies x tp x pp x cp x precision x compile x recompute, the best micro-batch of each,
then the strategy's own knobs on the leaders.

Bounded by construction: tp in 1, 2, 4, 8 (inside a node), pp in 1, 2, 4, cp (context parallelism, for a strategy
whose schema has it) over the divisors of world_size / tp that cut the sequence into 2 x cp chunks, without a
pipeline (what bench/spec/layout_rules.py refuses), the micro-batch over the divisors of
the per-rank batch (the best one of each group is kept: a group is one row), and a strategy's knobs (their
``tune`` candidates in the schema) tried one at a time, only on the ``LEADERS`` best rows; on a job that spans
nodes, a knob whose schema says ``tune_nodes`` (HSDP's replicas) is then tried at the number of nodes on each
leader's best setting.  A
strategy's ``fallback`` knobs (offload: host memory and PCIe time for device memory; loss_chunks: a head forward for
the logits' memory) are tried only where none of the strategy's rows fits without them, on its ``UNFIT_STRATEGY``
rows closest to fitting (``fallbacks``).  A knob
is applied only when the memory plan counts it (its value changes the planned peak): one whose memory the plan
does not see (CUDA graph pools, say) could turn a layout that "fits" into an out-of-memory.  Every key the user
set is kept as set.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable, Optional

from bench.run.config import FLOAT8_MIN_CC
from bench.machine.hardware import resolve as resolve_hardware
from bench.spec.layout_rules import CP_CHUNK_ROWS
from bench.planner.evaluate import FITS, NO_FIT, ORDER, Evaluator, Row
from bench.spec.schema import BenchConfig, fields_of, setting
from bench.strategies.registry import StrategySpec, get_spec

TP = (1, 2, 4, 8)
PP = (1, 2, 4)
RECOMPUTE = ("none", "selective", "op", "full")
LEADERS = 12  # rows whose strategy knobs are searched
PER_STRATEGY = 2  # and each strategy's best rows
UNFIT_STRATEGY = 48  # and, where none of a strategy's rows fits, that many of them
MAX_COMBINATIONS = 32  # of a row's counted knobs' values
MICRO_BATCH = "strategy.micro_batch_size"
MICRO_BATCH_COUNT = "strategy.microbatches"
PEAK = "predicted_peak_allocated_mb"


def divisors(n: int) -> list[int]:
    return sorted((d for d in range(1, n + 1) if n % d == 0), reverse=True)


def layouts(spec: StrategySpec, cfg: dict, per_node: int, fixed: set[str]) -> list[dict]:
    """(tp, pp, cp) changes of a strategy that splits the model; tensor parallelism stays inside a node.  A strategy
    whose default for a dimension is above 1 (``strategy=tp``, ``strategy=pp``) is that parallelism: its layouts
    keep it above 1 (with 1 it is another strategy's layout under a second name)."""
    world_size, names = cfg["world_size"], fields_of(spec.schema)
    least = {d: 2 if d in names and (names[d].default or 1) > 1 else 1 for d in ("tp", "pp")}
    tps = [t for t in TP if least["tp"] <= t <= per_node and world_size % t == 0] \
        if "tp" in names and "strategy.tp" not in fixed else [None]
    pps = [p for p in PP if p >= least["pp"] and world_size % p == 0] \
        if "pp" in names and "strategy.pp" not in fixed else [None]
    out = []
    for t, p in itertools.product(tps, pps):
        if (t or 1) * (p or 1) > world_size:
            continue
        for c in contexts(names, cfg, world_size // (t or 1), p, fixed):
            out.append({k: v for k, v in (("strategy.tp", t), ("strategy.pp", p), ("strategy.cp", c)) if v is not None})
    return out


def contexts(names: dict, cfg: dict, room: int, pp: Optional[int], fixed: set[str]) -> list[Optional[int]]:
    """cp sizes to try beside a (tp, pp): None (as composed) where the schema has no cp or the user set it; else 1
    and each divisor of the ranks left by tp (``room``) that cuts the sequence into 2 x cp chunks of whole CP_CHUNK_ROWS, none with a
    pipeline (a pipeline the user set: validation refuses cp, ``without_refused_cp``)."""
    if "cp" not in names or "strategy.cp" in fixed:
        return [None]
    if (pp or 1) > 1:
        return [1]
    return [c for c in sorted(divisors(room)) if c == 1 or cfg["model"]["seq_len"] % (CP_CHUNK_ROWS * 2 * c) == 0]


def precisions(spec: StrategySpec, cfg: dict, fixed: set[str]) -> list[dict]:
    """(precision, compile) changes: bf16 eager and compiled, and fp8 (compiled) where the strategy composes with
    torchao's float8 and the GPU has float8 tensor cores."""
    if "precision" in fixed:
        precs = [cfg["precision"]]
    else:
        hw = resolve_hardware(cfg)
        cc = hw.compute_capability if hw is not None else None
        precs = ["bf16"] + (["fp8"] if spec.float8 and cc and cc >= FLOAT8_MIN_CC else [])
    out = []
    for p in precs:
        compiles = [cfg["compile"]] if "compile" in fixed else ([True] if p == "fp8" else [False, True])
        out += [{"precision": p, **({} if "compile" in fixed else {"compile": c})} for c in compiles]
    return out


def recomputes(fixed: set[str]) -> list[dict]:
    """none, selective, op, full, and full on every second block (recompute_every=2: memory and extra forward
    between); and none with the loss in 8 chunks (loss_chunks=8: the logits' memory for one more head matmul, which
    on 4 x H100 let Llama-3 8B run without recomputation, faster than any recompute:
    results/2026-11-28-h100x4-llama8b-memory-knobs); where a strategy cannot chunk its loss, validation drops it."""
    if "recompute" in fixed:
        return [{}] if "recompute_every" in fixed else [{}, {"recompute_every": 2}]
    every = [] if "recompute_every" in fixed else [{"recompute": "full", "recompute_every": 2}]
    chunked = [] if "loss_chunks" in fixed else [{"recompute": "none", "loss_chunks": 8}]
    return [{"recompute": r} for r in RECOMPUTE] + every + chunked


def best_micro_batch(ev: Evaluator, base: dict, changes: dict, fixed: set[str]) -> Optional[Row]:
    """The best row of a group over its micro-batches (the divisors of the per-rank batch): fits before tight
    before does-not-fit, then the fastest predicted; None when no micro-batch validates."""
    first = ev(base, changes)
    if first is None:
        return None
    if fixed & {MICRO_BATCH, MICRO_BATCH_COUNT, "microbatches"}:
        return first
    per_rank = first.plan.micro_batch_size * first.plan.grad_accum
    # a micro-batch size replaces a pipeline's number of micro-batches (the two are one setting)
    own = {MICRO_BATCH_COUNT: None} if "microbatches" in base["strategy"] else {}
    rows = [r for r in (ev(base, {**changes, **own, MICRO_BATCH: b}) for b in divisors(per_rank)) if r is not None]
    if not rows:
        return None
    fitting = [r for r in rows if r.verdict != NO_FIT]
    if not fitting:  # none fits: the smallest micro-batch, to show how far off it is
        return rows[-1]
    return min(fitting, key=Row.rank_key)


def tunable_knobs(spec: StrategySpec, fixed: set[str]) -> list[tuple[str, tuple, dict]]:
    """(dotted key, candidate values, what a value needs) of the strategy's and the run's tune knobs the grid does
    not vary itself and the user did not set."""
    grid = {MICRO_BATCH, MICRO_BATCH_COUNT, "compile", "recompute", "precision"}
    out = []
    for prefix, schema in (("strategy.", spec.schema), ("", BenchConfig)):
        for name, f in fields_of(schema).items():
            key = prefix + name
            if f.metadata.get("tune") and key not in grid and key not in fixed:
                out.append((key, tuple(f.metadata["tune"]), dict(f.metadata.get("requires") or {})))
    return out


def node_knobs(spec: StrategySpec, fixed: set[str], nodes: int) -> list[tuple[str, tuple, dict]]:
    """On a job over ``nodes`` > 1 nodes, the strategy's ``tune_nodes`` knobs the user did not set, at their default
    and ``nodes`` (validation refuses a value that does not divide the data-parallel ranks)."""
    return [(f"strategy.{name}", (f.default, nodes), dict(f.metadata.get("requires") or {}))
            for name, f in fields_of(spec.schema).items()
            if nodes > 1 and f.metadata.get("tune_nodes") and f"strategy.{name}" not in fixed]


def fallback_knobs(spec: StrategySpec, fixed: set[str]) -> list[tuple[str, tuple, dict]]:
    """(dotted key, candidate values, what a value needs) of the strategy's and the run's ``fallback`` knobs the user
    did not set (offload; loss_chunks, where the strategy runs it: validation refuses it elsewhere)."""
    return [(prefix + name, tuple(f.metadata["fallback"]), dict(f.metadata.get("requires") or {}))
            for prefix, schema in (("strategy.", spec.schema), ("", BenchConfig))
            for name, f in fields_of(schema).items()
            if f.metadata.get("fallback") and prefix + name not in fixed]


def counted_knobs(ev: Evaluator, base: dict, row: Row, knobs: Iterable[tuple[str, tuple, dict]]) -> list[tuple]:
    """(key, values) of the knobs that can apply to a row and whose memory the plan counts: some value other than
    the row's changes its planned peak (at the row's micro-batch).  Others are never applied."""
    out = []
    for key, values, needs in knobs:
        if any(setting(row.plan.run, k) != v for k, v in needs.items()):
            continue
        others = [ev(base, {**row.changes, key: v}) for v in values if v != setting(row.plan.run, key)]
        if any(o is not None and o.memory[PEAK] != row.memory[PEAK] for o in others):
            out.append((key, values))
    return out


def improve_knobs(ev: Evaluator, base: dict, row: Row, fixed: set[str], knobs: Iterable[tuple[str, tuple, dict]]
                  ) -> tuple[Row, list[Row]]:
    """Every combination of the counted knobs' values on a row (``MAX_COMBINATIONS`` at most), the best micro-batch
    again for each; the best ranked.  Returns (best, the rows it was chosen among)."""
    counted = counted_knobs(ev, base, row, knobs)
    best, seen = row, [row]
    for combo in nearest_combinations(counted, [setting(row.plan.run, k) for k, _ in counted]):
        cand = best_micro_batch(ev, base, {**row.changes, **dict(zip((k for k, _ in counted), combo))}, fixed)
        if cand is None:
            continue
        seen.append(cand)
        if cand.rank_key() < best.rank_key():
            best = cand
    return best, seen


def nearest_combinations(counted: list[tuple], current: list) -> list[tuple]:
    """The counted knobs' value combinations, those that change the fewest knobs from the row's ``current`` values
    first, ``MAX_COMBINATIONS`` at most: every single change is tried before any pair (a cut-off product would
    never vary the first knobs)."""
    combos = itertools.product(*(values for _, values in counted))
    ranked = sorted(combos, key=lambda c: sum(v != cur for v, cur in zip(c, current)))
    return ranked[:MAX_COMBINATIONS]


def grid(spec: StrategySpec, cfg: dict, per_node: int, fixed: set[str]) -> list[dict]:
    """Every group's changes of one strategy (its search bases, e.g. ZeRO's stages, each a strategy of its own)."""
    bases = [dict(zip(spec.search_bases, vals)) for vals in itertools.product(*spec.search_bases.values())] \
        if spec.search_bases and not any(k in fixed or k.rsplit(".", 1)[-1] in fixed for k in spec.search_bases) \
        else [{}]  # a base the user set, or its top-level shorthand (zero_stage=3), is kept
    parts = [bases, layouts(spec, cfg, per_node, fixed), precisions(spec, cfg, fixed), recomputes(fixed)]
    return [{k: v for d in combo for k, v in d.items()} for combo in itertools.product(*parts)]


def search(bases: dict[str, dict], per_node: int, fixed: set[str], ev: Evaluator,
           progress: Callable[[str], None] = lambda s: None) -> list[Row]:
    """All groups of all strategies (``bases``: strategy name -> its composed config), ranked, the strategy knobs
    searched on the leaders."""
    rows = []
    for name, base in bases.items():
        groups = without_refused_cp(ev, base, grid(get_spec(name), base, per_node, fixed))
        progress(f"{name}: {len(groups)} groups")
        rows += [r for r in (best_micro_batch(ev, base, g, fixed) for g in groups) if r is not None]
    rows.sort(key=Row.rank_key)
    for i in leaders(rows):
        row, base, spec = rows[i], bases[rows[i].strategy], get_spec(rows[i].strategy)
        rows[i], _ = improve_knobs(ev, base, row, fixed, tunable_knobs(spec, fixed))
        across = node_knobs(spec, fixed, nodes_of(base, per_node))
        if across:  # then the best setting's replicas across nodes (one more knob, not a doubled product of all)
            rows[i], _ = improve_knobs(ev, base, rows[i], fixed, across)
    rows.sort(key=Row.rank_key)  # the fallbacks' "closest to fitting" is this order
    return _unique(sorted(fallbacks(ev, bases, rows, fixed), key=Row.rank_key))


def nodes_of(base: dict, per_node: int) -> int:
    """The nodes a job spans (1 where its world size is not whole nodes)."""
    ws = base["world_size"]
    return ws // per_node if ws > per_node and ws % per_node == 0 else 1


def fallbacks(ev: Evaluator, bases: dict[str, dict], rows: list[Row], fixed: set[str]) -> list[Row]:
    """The ranked ``rows`` with each strategy's fallback knobs (offload) tried where none of its rows fits (tight
    at best), on its ``UNFIT_STRATEGY`` rows closest to fitting that such a knob applies to.  A row the knobs
    bring to a better verdict replaces it where it did not fit, and joins it where it was tight (the tight row,
    faster, stays to choose from)."""
    fitting = {r.strategy for r in rows if r.verdict == FITS}
    out, tried = list(rows), {}
    for i, row in enumerate(rows):
        knobs = fallback_knobs(get_spec(row.strategy), fixed) if row.strategy not in fitting else []
        if not knobs or tried.get(row.strategy, 0) >= UNFIT_STRATEGY:
            continue
        base = bases[row.strategy]
        if not counted_knobs(ev, base, row, knobs):
            continue  # no fallback applies to this layout (the strategy's rules refuse it there)
        tried[row.strategy] = tried.get(row.strategy, 0) + 1
        best, _ = improve_knobs(ev, base, row, fixed, knobs)
        if ORDER[best.verdict] < ORDER[row.verdict]:
            if row.verdict == NO_FIT:
                out[i] = best
            else:
                out.append(best)
    return out


def without_refused_cp(ev: Evaluator, base: dict, groups: list[dict]) -> list[dict]:
    """A strategy's groups without context parallelism where its rules refuse it (a schema that inherits the knob,
    an implementation that does not run it): one candidate, the first group with cp > 1, tells."""
    trial = next((g for g in groups if g.get("strategy.cp", 1) > 1), None)
    if trial is None or ev.refuses(base, trial) != "strategy.cp":
        return groups
    return [g for g in groups if g.get("strategy.cp", 1) == 1]


def leaders(rows: list[Row]) -> list[int]:
    """Indexes of the rows whose knobs are searched: the ``LEADERS`` best overall, each strategy's ``PER_STRATEGY``
    best, and, for a strategy none of whose rows fits, its ``UNFIT_STRATEGY`` closest to fitting (a knob the plan
    counts, FSDP2's sync_every_microbatch, can make a layout fit that does not without it; offload: ``fallbacks``).
    A strategy's context-parallel rows (cp > 1) are counted apart from its others, so that they fitting (their
    activations split) never leaves the others unsearched (nor the others fitting, them)."""
    key = lambda r: (r.strategy, r.plan.cp > 1)  # noqa: E731
    fitting = {key(r) for r in rows if r.verdict == FITS}
    picked: list[int] = []
    per: dict[tuple, int] = {}
    for i, r in enumerate(rows):
        n = per.get(key(r), 0)
        if i < LEADERS or n < (PER_STRATEGY if key(r) in fitting else UNFIT_STRATEGY):
            picked.append(i)
        per[key(r)] = n + 1
    return picked


def _unique(rows: list[Row]) -> list[Row]:
    """One row per distinct setting (a knob search can reach a setting another group already is)."""
    from bench.run.runs import run_key

    seen, out = set(), []
    for r in rows:
        key = run_key(r.plan.cfg)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out

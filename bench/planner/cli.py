"""``python -m bench.planner key=value ...``: plan the user's whole job and print the ranked layouts."""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Optional

from bench.planner import reduction
from bench.planner.evaluate import FITS, Evaluator
from bench.planner.job import Question, common_overrides, compose, job_overrides, parse
from bench.planner.search import search
from bench.planner.table import lines, record, same_setting, write
from bench.spec.commands import override_key
from bench.spec.schema import ConfigError, ModelConfig, typed
from bench.units import count_text
from bench.strategies.registry import specs

log = logging.getLogger("bench.planner")
HELP = """usage: python -m bench.planner [--config-dir DIR] [planner keys] [bench overrides]

Plans your whole job: every strategy and layout that validates, its memory verdict (fits / tight / does not fit),
its predicted tokens/s with the prediction's measured error, days and GPU-hours; ranked, each row a command.

planner keys:
  nodes=N gpus_per_node=G      the machine (default: the hardware preset's GPUs per node, one node)
  tokens_per_step=1M           global batch in tokens (divided by model.seq_len); else model.global_batch
  train_tokens=1T              tokens to train: days and GPU-hours per row
  memory_budget_gib=N          verdicts against N GiB per GPU instead of the device's memory
  measure_top=K measure_with=[...]  run the first K rows that fit for real, predicted beside measured
  top=N out=DIR                rows printed (default 20); where plan.csv / plan.json go
flags:
  --config-dir DIR             your presets and probe profiles (DIR/hardware/NAME.yaml: hardware=NAME), as for bench
bench overrides: every key python -m bench takes (model=..., model=hf model.hf_config=..., hardware=...,
  model.seq_len=..., strategy=... to plan one strategy, grad_reduce=fp32|16bit to plan every strategy at one
  precision of the gradient sums); docs/knobs.md lists them.
exit codes: 0 a layout fits, 2 bad input (one line), 3 nothing fits."""


def bases(q: Question, common: list[str]) -> tuple[dict[str, dict], bool]:
    """(strategy -> its composed config, whether the user named the strategy): the one named, else every one."""
    named = any(override_key(o) == "strategy" for o in q.overrides)
    if named:
        cfg = compose(common, q.config_dirs)
        return {cfg["strategy"]["name"]: cfg}, True
    return {name: compose([*common, f"strategy={name}"], q.config_dirs) for name in specs()}, False


def header_lines(facts: dict, q: Question, counts: dict) -> list[str]:
    ws, per_node = facts["world_size"], facts["gpus_per_node"]
    budget = (f", memory budget {facts['memory_budget_gib']:g} GiB per GPU (the verdicts are against it)"
              if facts["memory_budget_gib"] else "")
    train = f"; {q.train_tokens:.3g} tokens to train" if q.train_tokens else "; train_tokens not given: no days"
    return [
        f"planner: {facts['nodes']} node(s) x {min(ws, per_node)} {facts['gpu']} (hardware={facts['hardware']}, "
        f"{facts['memory_gib']:g} GiB each{budget}), world_size {ws}",
        f"model {facts['model']} ({count_text(facts['parameters'])} parameters), sequence {facts['seq_len']}, global "
        f"batch {facts['global_batch']} = {facts['tokens_per_step']:,} tokens per step ({facts['global_batch_from']})"
        f"{train}",
        f"searched {counts['planned']} plans ({counts['invalid']} candidates do not validate and are skipped); "
        f"{counts['rows']} layouts ranked: {counts['fits']} fit, {counts['tight']} tight, "
        f"{counts['no_fit']} do not fit; in {counts['seconds']:.1f} s",
    ]


def plan(q: Question) -> tuple[dict, list[dict]]:
    """The answer: (header facts and counts, ranked records)."""
    t0 = time.time()
    probe = compose(q.overrides, q.config_dirs)
    if probe.get("tuning", "default") != "default":
        raise ConfigError("tuning", probe["tuning"], "the planner chooses every knob itself; leave tuning=default")
    sizing, facts = job_overrides(q, probe)
    common = common_overrides(q, sizing)
    by_strategy, named = bases(q, common)
    facts.update(model=probe["model"]["name"], parameters=_parameters(typed(ModelConfig, probe["model"])))
    fixed = {override_key(o) for o in q.overrides}
    ev = Evaluator()
    rows = search(by_strategy, facts["gpus_per_node"], fixed, ev, progress=lambda s: log.debug("%s", s))
    records = same_setting([record(r, i + 1, by_strategy[r.strategy], common, named, q.train_tokens,
                                   q.bench_flags()) for i, r in enumerate(rows)])
    ranks = {(r["strategy"], repr(r["changes"])): r["rank"] for r in records}
    notes = reduction.notes(ev, by_strategy, rows, fixed, lambda row: ranks.get((row.strategy, repr(row.changes))))
    counts = {"planned": ev.planned, "invalid": len(ev.invalid), "rows": len(records),
              "fits": sum(r["verdict"] == FITS for r in records),
              "tight": sum(r["verdict"] == "tight" for r in records),
              "no_fit": sum(r["verdict"] == "does not fit" for r in records), "seconds": time.time() - t0}
    return {"question": {"argv": q.overrides, **{k: v for k, v in vars(q).items() if k != "overrides"}},
            "job": facts, "common_overrides": common, "counts": counts, "notes": notes}, records


def _parameters(model: ModelConfig) -> int:
    from bench.metrics.flops import total_params

    return total_params(model)


def out_dir(q: Question) -> Path:
    return Path(q.out) if q.out else Path("outputs") / "planner" / time.strftime("%Y-%m-%d/%H-%M-%S")


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        q = parse(list(sys.argv[1:] if argv is None else argv))
        if q.help:
            print(HELP)
            return 0
        head, records = plan(q)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    except Exception as e:  # a Hydra composition error (an unknown key, a missing config): one line
        if type(e).__module__.split(".")[0] not in ("hydra", "omegaconf"):
            raise
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for line in header_lines(head["job"], q, head["counts"]) + lines(records, q.top) + head["notes"]:
        print(line)
    if head["job"]["world_size"] > head["job"]["gpus_per_node"]:
        print(f"world_size {head['job']['world_size']} spans nodes: run a command with hydra/launcher=slurm "
              "(docs/sweeps.md#slurm)")
    folder = out_dir(q)
    csv_path, json_path = write(folder, head, records)
    print(f"written: {csv_path}, {json_path}")
    if q.measure_top:
        from bench.planner.measure import measure

        return measure(q, head, records, folder)
    return 0 if any(r["verdict"] == FITS for r in records) else 3

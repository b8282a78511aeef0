"""The study bench grew from, as an external check: its published scaling efficiencies on 4 x RTX A6000 (PCIe)
beside what bench predicts for the same runs with ``hardware=rtx_a6000`` (``python -m bench.study``).

"Distributed Training Strategies on Commodity Hardware" (Akbulut, Chowdhury, Gutierrez; ../shared/seeds) states
its efficiencies in words, for models of 300M parameters and up; bench/study_reference.json quotes them.  Efficiency is the
study's: N-GPU tokens/s / (N x one GPU's tokens/s at the same global batch), the 1-GPU run its ``single``.
Each run is the study's own (``+experiment=paper_megatron`` / ``paper_zero``: its batch, sequence, accumulation),
planned on any machine.  Nothing here is fitted to these numbers: docs/study.md says what changed and why.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import statistics
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "study.md"
BEGIN = "<!-- study: begin (python -m bench.study --write renders this block) -->"
END = "<!-- study: end -->"
# the study's statements, each with the preset and arm of its runs (data, not code: bench/study_reference.json)
REFERENCE = json.loads((Path(__file__).with_name("study_reference.json")).read_text())
MODELS = tuple(REFERENCE["models"])
PUBLISHED = tuple(REFERENCE["statements"])


@functools.lru_cache(maxsize=None)
def _tokens_per_s(preset: str, arm: str, model: str, world_size: int) -> Optional[float]:
    from hydra import compose, initialize_config_dir

    from bench.run.config import register_configs, validate
    from bench.plan.predict import predict
    from bench.spec.schema import ConfigError

    register_configs()
    overrides = [f"+experiment={preset}", f"+experiment/arm={arm}", f"model={model}", f"world_size={world_size}",
                 "hardware=rtx_a6000", "dry_run=true"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    try:
        return predict(validate(cfg, gpus=0))["tokens_per_s"]
    except ConfigError:  # a layout the model cannot take (tp not dividing the heads, say)
        return None


def rows() -> list[dict]:
    """One row per published statement: the study's number and bench's prediction per model and their median."""
    out = []
    for st in PUBLISHED:
        preset, ws, eff = st["preset"], st["world_size"], {}
        for model in MODELS:
            one = _tokens_per_s(preset, REFERENCE["baseline_arm"], model, 1)
            many = _tokens_per_s(preset, st["arm"], model, ws)
            eff[model] = many / (ws * one) if one and many else None
        known = [v for v in eff.values() if v is not None]
        out.append({"strategy": st["label"], "gpus": ws, "study_words": st["words"], "study": st["efficiency"],
                    "bench": eff, "bench_median": statistics.median(known) if known else None})
    return out


def _pct(x: Optional[float], digits: int = 0) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def block(table: list[dict]) -> str:
    """docs/study.md's table, rendered from the predictions (a test checks the page holds what this renders)."""
    head = ["| strategy | GPUs | the study (its words) | the study | " + " | ".join(f"bench {m}" for m in MODELS)
            + " | bench, median | bench - study |", "|---|---:|---|---:|" + "---:|" * (len(MODELS) + 2)]
    body = []
    for r in table:
        gap = (f"{100 * (r['bench_median'] - r['study']):+.1f} points"
               if r["study"] is not None and r["bench_median"] is not None else "-")
        body.append(f"| {r['strategy']} | {r['gpus']} | {r['study_words']} | {_pct(r['study'])} | "
                    + " | ".join(_pct(r["bench"][m]) for m in MODELS) + f" | {_pct(r['bench_median'], 1)} | {gap} |")
    return "\n".join([BEGIN, "", *head, *body, "", END])


def block_in(path: Path = DOCS) -> Optional[str]:
    hit = re.search(re.escape(BEGIN) + ".*?" + re.escape(END), path.read_text(), re.S)
    return hit.group(0) if hit else None


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.study", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite the table in {DOCS.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    text = block(rows())
    print(text)
    if args.write:
        old = block_in()
        if old is None:
            raise SystemExit(f"{DOCS} has no block between {BEGIN!r} and {END!r}")
        DOCS.write_text(DOCS.read_text().replace(old, text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

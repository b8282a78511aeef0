"""The answer of multirun_analysis on a real CPU sweep: workloads never mixed, each strategy's default
beside its best, the memory-budget filter, and the winner as a command line."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import CPU_FAST, REPO, run_bench


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("answer") / "sweep"
    p = run_bench("strategy=ddp", "world_size=2", "strategy.bucket_cap_mb=25,100", "model.global_batch=8,16",
                  *CPU_FAST, run_dir=d, multirun=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return d


def test_workloads_are_never_ranked_together_and_default_sits_beside_best(sweep):
    import multirun_analysis as ma

    s = ma.summarize(ma.load_runs(sweep))
    assert len(s) == 4
    t = ma.default_vs_best(s)
    assert sorted(t["tokens_per_step"]) == [8 * 128, 16 * 128]  # one row per workload: never mixed
    for _, r in t.iterrows():
        assert r["strategy_id"] == "ddp" and r["n_settings"] == 2
        assert r["best_tokens_per_s"] >= r["default_tokens_per_s"] > 0
        assert r["gain"] == pytest.approx(r["best_tokens_per_s"] / r["default_tokens_per_s"])
        want = "" if r["best_tokens_per_s"] == r["default_tokens_per_s"] else "bucket_cap_mb=100"
        assert r["knobs_that_differ"] == want
        assert ma.answer.command_line(r["command"]).startswith("python -m bench ")
    lines = "\n".join(ma.ranked(s))
    assert lines.count("use **ddp**") == 2 and "1024 tokens per step" in lines and "2048 tokens per step" in lines
    assert "a tie" not in lines and "ties with" not in lines  # one run per setting: the spread is unknown, nothing is called a tie


def test_memory_budget_and_the_command_line(sweep, tmp_path):
    p = subprocess.run([sys.executable, "-m", "multirun_analysis", str(sweep), "--no-plots", "--memory-budget-gib",
                        "0.01", "--out", str(tmp_path / "a")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "no strategy fits 0.01 GiB per GPU" in p.stdout and "does not fit 0.01 GiB: ddp (peak" in p.stdout
    p = subprocess.run([sys.executable, "-m", "multirun_analysis", str(sweep), "--no-plots", "--memory-budget-gib",
                        "64", "--out", str(tmp_path / "b")], cwd=REPO, capture_output=True, text=True, timeout=120)
    md = (tmp_path / "b" / "report.md").read_text()
    assert "(within 64 GiB)" in md and "python -m bench " in md and "strategy=ddp" in md and "world_size=2" in md
    assert "## Each strategy at its defaults and at its best" in md


def test_best_is_ranked_among_the_longest_measurements_only():
    """A search's rung-0 loser measured once over 6 steps is not ranked above settings measured over 18
    (bench.sweep.search.winner uses the same rule, so tune.json and the report agree)."""
    import pandas as pd

    from multirun_analysis.answer import _best

    g = pd.DataFrame({"label": ["short", "long-a", "long-b"], "steps": [10, 22, 22], "warmup_steps": [4, 4, 4],
                      "tokens_per_s": [211.0, 210.0, 209.0], "n_runs": [1, 2, 2]})
    assert _best(g)["label"] == "long-a"
    assert _best(g.iloc[[0]])["label"] == "short"  # nothing longer: the short one is the best there is


def test_a_tie_is_where_the_repeats_overlap():
    """The answer calls a strategy tied with the winner only where both were measured at least twice and
    the repeats overlap (the recorded H200 search: 300m single 210,070-210,292 and 1-rank DDP
    210,055-210,076 tokens/s, one program measured twice each)."""
    import pandas as pd

    from multirun_analysis.answer import ties_with

    def best(lo, hi, n):
        return pd.Series({"best_tokens_per_s_min": lo, "best_tokens_per_s_max": hi, "best_n_runs": n})

    winner = best(210_070, 210_292, 2)
    assert ties_with(best(210_055, 210_076, 2), winner)
    assert not ties_with(best(200_148, 200_810, 2), winner)  # zero-0: 95% and apart
    assert not ties_with(best(210_100, 210_100, 1), winner)  # one run: its spread is unknown
    assert not ties_with(best(210_055, 210_076, 2), best(210_070, 210_070, 1))


def test_a_strategys_name_in_the_answer_prints_its_knobs_as_typed():
    """Table cells read back as floats (tp 2.0, ZeRO stage 3.0) print as the user types them; each strategy
    names its own variant (StrategySpec.label), the layout and recompute are added generically."""
    import pandas as pd

    from multirun_analysis.answer import _strategy_name

    cols = ["strategy", "model", "tp", "pp", "zero_stage", "offload_optimizer", "recompute"]
    fsdp = pd.Series({"strategy": "fsdp", "model": "300m", "tp": 2.0, "pp": 1.0, "recompute": "full"})
    assert _strategy_name(fsdp, cols) == "fsdp tp=2 recompute=full"
    zero = pd.Series({"strategy": "zero", "zero_stage": 3.0, "offload_optimizer": "cpu", "tp": None})
    assert _strategy_name(zero, cols) == "zero-3 offload_optimizer=cpu"


def test_every_ranked_row_carries_the_layout_it_ran(sweep):
    """The answer names each strategy's layout (tp, pp, dp, micro-batch x accumulation, recompute) and precision,
    as the runs' own metrics.json recorded them."""
    import json

    import multirun_analysis as ma

    s = ma.summarize(ma.load_runs(sweep))
    t = ma.default_vs_best(s)
    for _, r in t.iterrows():
        m = next(json.loads(f.read_text()) for f in sorted(sweep.glob("*/metrics.json"))
                 if json.loads(f.read_text())["config"]["model"]["global_batch"] * 128 == r["tokens_per_step"])
        lay = m["layout"]
        want = (f"tp={lay['tp']} pp={lay['pp']} dp={lay['dp']} mb={lay['micro_batch_size']}x{lay['grad_accum']} "
                f"rc={m['config']['recompute']}")
        assert r["layout"] == want and lay["dp"] == 2, (r["layout"], want)
        text = "\n".join(ma.ranked(s))
        assert f"; {want}, fp32), " in text and "1. ddp: 100% of the winner" in text and f"({want}, fp32)" in text, text
    assert {r["layout"] for _, r in t.iterrows()} == {"tp=1 pp=1 dp=2 mb=4x1 rc=none", "tp=1 pp=1 dp=2 mb=8x1 rc=none"}


def test_a_ranking_of_different_gradient_sum_precisions_says_so(tmp_path):
    """A real bf16 sweep: DDP sums gradients in fp32, ZeRO (DeepSpeed's own bf16) in bf16; each run's record says
    which (layout.grad_reduce), and the answer notes the ranking mixes them and names grad_reduce."""
    import multirun_analysis as ma

    narrow = ("precision=bf16", "model.n_layers=2", "model.seq_len=64", "model.d_model=128", "model.d_ff=512",
              "model.vocab_size=512")  # bf16 on this CPU is slow: tests/test_sharding.py
    d = tmp_path / "sweep"
    p = run_bench("strategy=ddp,zero", "world_size=2", *(o for o in CPU_FAST if not o.startswith("precision=")),
                  *narrow, run_dir=d, multirun=True)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = ma.load_runs(d)
    assert dict(zip(runs["strategy"], runs["layout.grad_reduce"])) == {"ddp": "fp32", "zero": "16bit"}
    text = "\n".join(ma.ranked(ma.summarize(runs)))
    assert "note: gradients are summed in 16bit by zero-0; in fp32 by ddp" in text, text
    assert "grad_reduce=fp32 or grad_reduce=16bit" in text

"""The planner says where its rows reduce gradients at different precisions, and what 16 bit would buy a strategy
that reduces them in fp32 (bench/planner/reduction.py). The number it quotes is checked against the dry run of that
row's own command with the knob added. ``grad_reduce`` plans every strategy at one precision."""
from __future__ import annotations

import re

from bench.plan.memory_model import memory_plan
from bench.plan.predict import predict
from bench.planner.cli import plan
from bench.planner.job import compose, parse
from bench.run.config import validate
from tests.conftest import REPO

PROBES = REPO / "results" / "2026-11-28-h100x4-slow-links-planner"  # its hardware/ holds the sockets probe
LLAMA_4 = ["model=llama3_1b", "nodes=1", "gpus_per_node=4"]


def dry_run(overrides: list[str], config_dirs: tuple = ()) -> dict:
    """What ``python -m bench [--config-dir D] OVERRIDES dry_run=true`` predicts."""
    p = validate(compose([*overrides, "dry_run=true"], [str(d) for d in config_dirs]), explicit=[])
    p.memory = memory_plan(p)
    return predict(p)


def test_over_sockets_ddps_16_bit_reduction_is_named_with_the_throughput_its_command_predicts():
    head, records = plan(parse(["--config-dir", str(PROBES), "hardware=h100x4_sockets", "link_regime=sockets",
                                *LLAMA_4]))
    by = {}
    for r in records:
        by.setdefault(r["strategy"], set()).add(r["grad_reduce"])
    assert by["ddp"] == {"fp32"} and "16bit" in by["zero"], by  # DeepSpeed's bf16 mode reduces in bf16
    assert any(r["grad_reduce"] is None and r["dp"] == 1 for r in records)  # no replicas, no reduction
    notes = "\n".join(head["notes"])
    assert "the ranking compares them at different precisions" in notes, notes
    m = re.search(r"ddp: with strategy\.comm_hook=bf16_compress .* \(rank (\d+)\) is predicted at ([\d,]+) tokens/s "
                  r"against ([\d,]+) \(\+(\d+)%\)", notes)
    assert m, notes
    rank, half, full = int(m[1]), *(float(m[i].replace(",", "")) for i in (2, 3))
    row = records[rank - 1]
    assert row["strategy"] == "ddp" and row["tokens_per_s"] == round(full)
    # the row's command, and with the knob: what `python -m bench ... dry_run=true` predicts for each
    assert abs(dry_run(row["overrides"], (PROBES,))["tokens_per_s"] - full) <= 1
    with_hook = dry_run([*row["overrides"], "strategy.comm_hook=bf16_compress"], (PROBES,))
    assert abs(with_hook["tokens_per_s"] - half) <= 1, (with_hook["tokens_per_s"], half)
    assert half > 1.5 * full  # the gradients' all-reduce is most of a sockets step: half its bytes, most of 2x


def test_on_nvlink_no_strategy_is_told_to_change_its_numerics_for_little():
    """Over NVLink the gradient all-reduce hides behind the backward: 16 bit would buy DDP less than NOTE_GAIN."""
    head, records = plan(parse(["hardware=h100_sxm_80gb", *LLAMA_4]))
    assert not any(n.startswith("ddp:") for n in head["notes"]), head["notes"]
    assert {r["grad_reduce"] for r in records if r["strategy"] == "ddp"} == {"fp32"}


def test_grad_reduce_plans_every_strategy_at_one_precision_of_the_gradient_sums():
    """Over sockets: with grad_reduce=fp32 every row with replicas sums in fp32, ZeRO too (DeepSpeed's
    communication_data_type, or no 16-bit module under its torch_autocast), and nothing is said about precisions;
    ZeRO's best row is then slower than at its own 16-bit default (twice the gradient bytes). With grad_reduce=16bit
    every such row sums in 16 bit, and single (nothing to reduce) is not a candidate."""
    question = ["--config-dir", str(PROBES), "hardware=h100x4_sockets", "link_regime=sockets", *LLAMA_4]
    answers = {g: plan(parse([*question, *([f"grad_reduce={g}"] if g else [])])) for g in ("", "fp32", "16bit")}
    for g in ("fp32", "16bit"):
        head, records = answers[g]
        assert {r["grad_reduce"] for r in records if r["dp"] > 1} == {g}, g
        assert {"ddp", "fsdp", "zero"} <= {r["strategy"] for r in records} and "single" not in {
            r["strategy"] for r in records}
        assert not any("different precisions" in n or n.startswith("ddp:") for n in head["notes"]), head["notes"]
        assert all(f"grad_reduce={g}" in r["overrides"] for r in records)  # each row's command says it
    best = {g: max(r["tokens_per_s"] for r in answers[g][1] if r["strategy"] == "zero") for g in answers}
    assert best["fp32"] < best[""] <= best["16bit"] * 1.001, best
    ddp = {g: max(r["tokens_per_s"] for r in answers[g][1] if r["strategy"] == "ddp") for g in answers}
    assert ddp["16bit"] > 1.5 * ddp[""] and ddp["fp32"] == ddp[""], ddp

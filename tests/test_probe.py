"""``python -m bench.probe`` on this CPU (gloo, 4 ranks, --quick): it writes a complete hardware profile, and a
dry run with ``hardware=<that profile>`` plans and predicts with the probe's numbers, not a datasheet's."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bench.run.config import register_configs, validate
from bench.machine.hardware import PRESETS, check
from tests.conftest import REPO, run_bench

register_configs()


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """(config dir, profile, probe stdout): the profile lies in a hardware/ folder, as Hydra looks for it."""
    d = tmp_path_factory.mktemp("probe")
    out = d / "hardware" / "ci_probe.yaml"
    p = subprocess.run([sys.executable, "-m", "bench.probe", "--out", str(out), "--world-size", "4", "--quick"],
                       cwd=REPO, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    return d, OmegaConf.to_container(OmegaConf.load(out)), p.stdout


@pytest.mark.slow
def test_the_probe_writes_a_complete_profile_of_what_it_measured(probed):
    d, prof, stdout = probed
    check(prof)  # the rule every hardware passes: no field missing, zero or negative
    assert prof["source"] == "probe" and prof["name"] == "ci_probe" and prof["intra_node_link"] == "host"
    assert set(prof["peak_tflops"]) == {"fp32", "bf16"}  # what a CPU run can use
    assert prof["gpus_per_node"] == 4 and prof["probe"]["backend"] == "gloo" and prof["probe"]["world_size"] == 4
    # one node: the network was not measured, and the profile says so rather than guessing
    assert prof["inter_node_gbps"] is None and "one node" in prof["probe"]["not_measured"]["inter_node_gbps"]
    curves = prof["probe"]["curves"]["intra_node"]
    assert set(curves) == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    # nccl-tests' PERFORMANCE.md at 4 ranks: all-reduce busbw = 1.5 algbw, all-gather / reduce-scatter 0.75
    for name, factor in (("all_reduce", 1.5), ("all_gather", 0.75), ("reduce_scatter", 0.75), ("send_recv", 1.0)):
        _check_rows(curves[name], factor)
    # groups of 2 of the node's 4 ranks: one alone, then both at once (at 2 ranks busbw = algbw)
    pairs = prof["probe"]["curves"]["intra_node_groups"]
    assert set(pairs) == {"2"} and set(pairs["2"]) == {"alone", "together"}
    for rows in pairs["2"].values():
        assert [r["bytes"] for r in rows] == [r["bytes"] for r in curves["all_reduce"]]
        _check_rows(rows, 1.0)
    assert prof["intra_node_gbps"] == pytest.approx(curves["all_reduce"][-1]["busbw_gbps"], rel=1e-3)
    assert f"--config-dir {d.resolve()} hardware=ci_probe" in stdout  # the command that uses it
    # the link regime it ran under and NCCL's transports (none on gloo: the link stays host, and says why)
    assert prof["probe"]["nccl"]["regime"] == "default" and prof["probe"]["nccl"]["transports"] is None
    assert prof["probe"]["measured"]["intra_node_link"].endswith("backend gloo: no NCCL")
    # causal attention's own rate against the matmul's, at two sequence lengths (the prediction's attention term)
    att = prof["attention"]
    assert set(att) == {"forward_share", "forward_seq_half", "backward_share", "backward_seq_half"}
    assert att["forward_share"] > 0 and att["backward_share"] > 0 and min(att.values()) >= 0
    assert "scaled_dot_product_attention" in prof["probe"]["measured"]["attention"]


def _check_rows(rows: list[dict], bus_factor: float) -> None:
    for row in rows:
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e3), rel=0.01, abs=2e-3)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * bus_factor, rel=0.01, abs=2e-3)


@pytest.mark.slow
def test_a_dry_run_plans_with_the_probes_numbers(probed, tmp_path):
    d, prof, _ = probed
    p = run_bench("--config-dir", str(d), "hardware=ci_probe", "dry_run=true", "strategy=ddp", "world_size=2",
                  run_dir=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    mem = plan["memory"]
    assert mem["device_memory_gib"] == prof["memory_gib"] and mem["device_memory_source"] == "hardware=ci_probe"
    assert mem["host_memory_gib"] == prof["host_memory_gib"]
    assert prof["memory_gib"] not in {p.memory_gib for p in PRESETS.values()}
    assert plan["config"]["hardware"]["source"] == "probe" and plan["prediction"] is not None


@pytest.mark.slow
def test_the_prediction_uses_the_probes_peak(probed):
    from bench.metrics.flops import causal_attention_flops_per_token
    from bench.plan.predict import terms

    d, prof, _ = probed
    plan = _plan(d, "strategy=ddp", "world_size=2")
    assert plan.cfg["precision"] == "bf16"
    t = terms(plan)
    assert t["peak"] == pytest.approx(prof["peak_tflops"]["bf16"] * 1e12)
    seq, a = plan.model.seq_len, prof["attention"]  # at this CPU's measured shares of its peak, not the H200's
    forward, backward = (prof["peak_tflops"]["bf16"] * 1e12 * a[f"{p}_share"] * seq / (seq + a[f"{p}_seq_half"])
                         for p in ("forward", "backward"))
    f, b = causal_attention_flops_per_token(plan.model, plan.layout.recompute)  # the step's forward / backward FLOPs
    assert t["attention_peak"] == pytest.approx((f + b) / (f / forward + b / backward))


def _plan(d, *overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra.searchpath=[file://{d}]", "hardware=ci_probe", "dry_run=true",
                                           *overrides])
    return validate(cfg, gpus=0)


@pytest.mark.slow
@pytest.mark.parametrize("overrides, curve", [
    (["strategy=ddp", "world_size=2"], "alone"),  # 2 of the node's 4 ranks: one pair, the others idle
    (["strategy=tp", "strategy.impl=torch", "strategy.tp=2", "world_size=2"], "alone"),
    (["strategy=fsdp", "strategy.tp=2", "world_size=4"], "together"),  # tp pairs and dp pairs, all busy
    (["strategy=ddp", "world_size=4"], None),  # the whole node: its own curve
])
def test_a_group_smaller_than_the_node_is_read_on_the_probes_curve_for_it(probed, overrides, curve):
    """The link a prediction reads on a probed node: each kind of bytes at its group's all-reduce bus bandwidth on
    the probe's curve for a group of that size (alone, or with every pair busy), at the step's typical message."""
    from bench.plan.link_terms import LINK_KINDS, on_curve
    from bench.plan.predict import terms
    from bench.plan.memory_model import memory_plan
    from bench.strategies.registry import get_spec

    d, prof, _ = probed
    plan = _plan(d, *overrides)
    traffic = get_spec(plan.strategy.name).traffic(plan, float(memory_plan(plan)["parameters_on_rank"]))
    sent = {k: traffic[k] for k in LINK_KINDS if traffic.get(k)}
    message = sum(sent.values()) / traffic["collectives"]
    curves = prof["probe"]["curves"]
    rows = curves["intra_node_groups"]["2"][curve] if curve else curves["intra_node"]["all_reduce"]
    assert terms(plan)["link_factor"] * prof["intra_node_gbps"] == pytest.approx(on_curve(rows, message), rel=1e-6)


def test_bad_probe_options_are_refused_in_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "bench.probe", "--out", str(tmp_path / "hardware" / "l40s.yaml"),
                        "--device", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().startswith("invalid probe option: --out=")
    assert "preset" in p.stderr and not (tmp_path / "hardware").exists()

"""HSDP: ``strategy=fsdp strategy.dp_replicate=N``, FSDP2 over a replicate x shard mesh.

A real 4-rank gloo run on CPU matches ``single``'s per-step losses (fp32, the 1e-5 of the other
equivalence tests) and records the mesh it ran; the knob is validated before launch; the memory plan
shards the states over the shard group only (plain FSDP over as many ranks is the reference), and the
traffic splits the gradient reduction into the shard group's reduce-scatter and the replicas' all-reduce
(plain FSDP and DDP over the group sizes are the references; what each costs on nodes: tests/test_topology.py).
"""
from __future__ import annotations

import pytest

from hydra import compose, initialize_config_dir

from bench.run.config import ConfigError, register_configs, validate
from bench.plan.memory_model import memory_plan
from bench.strategies.registry import get_spec
from tests.conftest import CPU_FAST, REPO, metrics_of, run_bench

TOL = 1e-5  # fp32, as the other loss-equivalence tests (tests/test_sharding.py)


def plan_of(*overrides: str, gpus: int = 0):
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=list(overrides)), gpus=gpus)


@pytest.mark.slow
def test_hsdp_world_4_matches_single(tmp_path, single_cpu):
    p = run_bench(*CPU_FAST, "strategy=fsdp", "world_size=4", "strategy.dp_replicate=2", run_dir=tmp_path,
                  timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m, want = metrics_of(tmp_path), metrics_of(single_cpu)["loss"]["per_step"]
    assert m["status"] == "completed", m.get("error")
    got = m["loss"]["per_step"]
    assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) <= TOL, (got, want)
    t, model = m["throughput"], m["config"]["model"]  # the global batch counted once per step
    assert t["tokens_per_step"] == t["tokens_per_step_expected"] == model["global_batch"] * model["seq_len"], t
    lay = m["layout"]
    assert (lay["dp"], lay["dp_replicate"], lay["dp_shard"]) == (4, 2, 2), lay
    assert lay["device_mesh"] == {"shape": [1, 2, 2, 1, 1], "dims": ["pp", "dp_replicate", "dp_shard", "cp", "tp"]}
    assert lay["dp_reduction"].startswith("HSDP") and "dp_replicate 2 x dp_shard 2" in lay["dp_reduction"]


@pytest.mark.parametrize("overrides,says", [
    (["world_size=4", "strategy.dp_replicate=3"], "valid: 1, 2, 4"),
    (["world_size=4", "strategy.dp_replicate=0"], "valid: 1, 2, 4"),
    (["world_size=4", "strategy.tp=2", "strategy.dp_replicate=4"], "data-parallel size 2"),  # dp = 4 / tp
    (["world_size=2", "strategy.dp_replicate=2", "strategy.pp=2"], "valid: 1"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_dp_replicate_must_divide_dp(overrides, says):
    with pytest.raises(ConfigError) as e:
        plan_of("strategy=fsdp", "device=cpu", *overrides)
    assert e.value.key == "strategy.dp_replicate" and says in str(e.value), str(e.value)


def test_dp_replicate_dividing_dp_is_valid():
    assert plan_of("strategy=fsdp", "device=cpu", "world_size=4", "strategy.dp_replicate=4").dp_size == 4
    assert plan_of("strategy=fsdp", "device=cpu", "world_size=4", "strategy.tp=2",
                   "strategy.dp_replicate=2").dp_size == 2


GPU4 = ("strategy=fsdp", "device=cuda", "precision=bf16", "model.global_batch=8")


def _plan(*o: str, world: int):
    return plan_of(*GPU4, f"world_size={world}", *o, gpus=world)


@pytest.mark.parametrize("reshard", ["true", "false"])
def test_hsdp_states_are_sharded_over_the_shard_group(reshard):
    """Replicate 2 x shard 2 holds what plain FSDP over 2 ranks holds (the same shard group), half of
    what plain FSDP over 4 ranks would not."""
    o = f"strategy.reshard_after_forward={reshard}"
    hsdp = memory_plan(_plan(o, "strategy.dp_replicate=2", world=4))["model_states"]["device_mb"]
    fsdp2 = memory_plan(_plan(o, world=2))["model_states"]["device_mb"]
    fsdp4 = memory_plan(_plan(o, world=4))["model_states"]["device_mb"]
    assert hsdp == fsdp2
    assert hsdp["optimizer"] == pytest.approx(2 * fsdp4["optimizer"], abs=0.1)


def test_hsdp_traffic_is_the_shard_groups_plus_the_replicas_all_reduce():
    """Gathers and reduce-scatters as plain FSDP over dp_shard ranks; the extra all-reduce carries each
    rank's 1/dp_shard of the gradient over dp_replicate ranks: half of what DDP over 2 ranks sends for the
    whole fp32 gradient."""
    psi = 1e8
    hsdp = get_spec("fsdp").traffic(_plan("strategy.dp_replicate=2", world=4), psi)
    fsdp2 = get_spec("fsdp").traffic(_plan(world=2), psi)
    ddp2 = get_spec("ddp").traffic(plan_of("strategy=ddp", "device=cuda", "precision=bf16", "model.global_batch=8",
                                           "world_size=2", gpus=2), psi)
    assert hsdp["param_gather"] == fsdp2["param_gather"] and hsdp["grad_reduce"] == fsdp2["grad_reduce"]
    assert hsdp["grad_replicate"] == pytest.approx(ddp2["grad_reduce"] / 2)  # over the replicate group
    assert "grad_replicate" not in fsdp2


def test_hsdp_is_named_in_the_analysis():
    spec = get_spec("fsdp")
    assert spec.label("fsdp", {"dp_replicate": 2}) == ["fsdp", "dp_replicate=2"]
    assert spec.label("fsdp", {"dp_replicate": 1}) == ["fsdp"]

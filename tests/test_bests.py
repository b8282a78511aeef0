"""Measured bests for the user's workload (bench/plan/bests.py): tuning=best takes the nearest measured workload's
settings on the same device type, or the static profile, never a setting the memory plan says will not fit;
strategy.micro_batch_size=auto; and the knob search ordered and pruned by the throughput prediction.

Configs are composed by Hydra as a user's; GPUs are planned for with dry_run=true and a hardware preset (a preset
whose gpu is renamed is a device type only this file's store knows)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from bench.plan import bests
from bench.run.config import register_configs, validate
from bench.plan.memory_model import memory_plan
from bench.spec.schema import ConfigError
from bench.strategies.registry import get_spec
from tests.conftest import CPU_FAST, REPO, metrics_of, run_bench

register_configs()
GPU = "Test GPU 80GB"  # hardware=h100_sxm_80gb renamed: no shipped entry names it
ON_GPU = ("dry_run=true", "hardware=h100_sxm_80gb", f"hardware.gpu='{GPU}'")
FSDP = ("strategy=fsdp", "model.global_batch=16")
FSDP_300M = (*FSDP, "model=300m")
LLAMA_8B = ("model=llama3_8b", "strategy=fsdp", "world_size=8", "model.global_batch=64", "dry_run=true",
            "hardware=h100_sxm_80gb")


def plan(*overrides: str, explicit=()):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=list(overrides)), gpus=0, explicit=explicit)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A user store of its own (BENCH_BESTS) holding one measured fsdp best: 300m, 1 rank, 16 x 1024 tokens
    per micro-batch, bf16, on GPU: units of 4 blocks, compiled."""
    path = tmp_path / "bests.json"
    monkeypatch.setenv("BENCH_BESTS", str(path))
    p = plan(*FSDP_300M, *ON_GPU)
    e = {"strategy": bests.stored_identity(get_spec("fsdp"), p.cfg["strategy"]),
         "settings": {"strategy.blocks_per_unit": 4, "compile": True}, "tokens_per_s": 199_500.0,
         "peak_memory_mb": 18_000.0, "workload": bests.plan_workload(p, GPU), "source": "results/test#tune"}
    bests.record([e])
    return path, e


def test_distance_is_the_log_ratios_plus_what_does_not_match():
    w = {"device": GPU, "arch": "gpt", "parameters": 300e6, "world_size": 2, "tokens_per_microbatch": 16384,
         "precision": "bf16"}
    assert bests.distance(w, w)[0] == 0
    assert bests.distance(w, {**w, "parameters": 600e6})[0] == 1.0  # twice the parameters: still near
    assert bests.distance(w, {**w, "world_size": 4})[0] == 1.0
    assert bests.distance(w, {**w, "world_size": 1})[0] == 2.0  # one rank: no communication at all
    assert bests.distance(w, {**w, "arch": "llama"})[0] == bests.ARCH_COST
    assert bests.distance(w, {**w, "precision": "fp16"})[0] > bests.NEAR  # another precision is never near
    d, parts = bests.distance(w, {**w, "parameters": 600e6, "tokens_per_microbatch": 8192})
    assert d == 2.0 > bests.NEAR and parts["parameters"] == parts["tokens_per_microbatch"] == 1.0


def test_a_sibling_gpu_is_near_and_another_architecture_is_never_compared():
    """H100 80GB and H200 are one architecture (the presets' compute capability 9.0) with other memory: a best
    measured on one is a candidate for the other, at a cost; an A100's never is."""
    w = {"device": "NVIDIA H100 80GB HBM3", "arch": "llama", "parameters": 8e9, "world_size": 4,
         "tokens_per_microbatch": 2048, "precision": "bf16"}
    d, parts = bests.distance(w, {**w, "device": "NVIDIA H200"})
    assert d == parts["device"] == bests.SIBLING_COST <= bests.NEAR
    assert bests.distance(w, {**w, "device": "NVIDIA A100-SXM4-80GB"})[0] == float("inf")
    assert bests.distance(w, {**w, "device": "cpu"})[0] == float("inf")


def test_tuning_best_on_an_h100_takes_the_h200_measurement_of_its_workload(tmp_path, monkeypatch):
    """A user store holding an H200 search of this workload (2 ranks): on an H100 tuning=best applies it, at the
    sibling's distance, instead of the shipped one-rank H100 entries (distance 2) or the static profile."""
    monkeypatch.setenv("BENCH_BESTS", str(tmp_path / "bests.json"))
    on_h100 = (*FSDP_300M, "world_size=2", "dry_run=true", "hardware=h100_sxm_80gb")
    p = plan(*on_h100)
    bests.record([{"strategy": bests.stored_identity(get_spec("fsdp"), p.cfg["strategy"]),
                   "settings": {"strategy.blocks_per_unit": 4}, "tokens_per_s": 300_000.0,
                   "peak_memory_mb": 18_000.0, "workload": bests.plan_workload(p, "NVIDIA H200"),
                   "source": "results/test#tune"}])
    src = plan(*on_h100, "tuning=best").tuning["source"]
    assert src["kind"] == "measured" and src["workload"]["device"] == "NVIDIA H200"
    assert src["distance"] == src["distance_parts"]["device"] == bests.SIBLING_COST


def test_a_near_measured_workload_is_applied_and_recorded_with_its_distance(store):
    """Twice the tokens per micro-batch of the measured one: distance 1, near; its settings, not the static
    profile's (units of 8, no resharding), and the record names the measurement and the distance."""
    p = plan("tuning=best", *FSDP_300M, "model.global_batch=32", *ON_GPU)
    src = p.tuning["source"]
    assert src["kind"] == "measured" and src["distance"] == 1.0 and src["distance_parts"]["tokens_per_microbatch"] == 1
    assert src["source"] == "results/test#tune" and src["store"] == "user" and src["workload"]["device"] == GPU
    assert (p.strategy.blocks_per_unit, p.cfg["compile"], p.strategy.reshard_after_forward) == (4, True, True)
    assert "results/test#tune" in p.tuning["applied"]["strategy.blocks_per_unit"]["evidence"]
    assert "from the measured best of 300m" in p.tuning["summary"] and "distance 1.00" in p.tuning["summary"]
    # what the user sets still wins over a measurement
    p = plan("tuning=best", *FSDP_300M, *ON_GPU, "compile=false", explicit=["compile"])
    assert p.cfg["compile"] is False and "compile" in p.tuning["kept"] and p.tuning["source"]["distance"] == 0


@pytest.mark.parametrize("overrides,why", [
    (("model=300m", "world_size=2", "model.global_batch=32"), "distance 2.00 > 1"),  # 1 -> 2 ranks: communication
    (("model=1b",), "is at distance"),  # 3.4x the parameters
    (("model=300m", "hardware.gpu='Other GPU'"), "no measured best of this strategy on Other GPU"),
    (("model=300m", "strategy.prefetch=1"), "no measured best of this strategy"),  # another strategy identity
])
def test_without_a_near_one_the_static_profile_applies_and_says_why(store, overrides, why):
    p = plan("tuning=best", *FSDP, *ON_GPU, *overrides)
    src = p.tuning["source"]
    assert src["kind"] == "static" and why in src["reason"] and "static profile" in p.tuning["summary"], src
    assert p.strategy.blocks_per_unit == 8  # the static profile's


def test_a_cpu_run_uses_the_static_profile_and_says_so(store):
    p = plan("tuning=best", "strategy=fsdp", "world_size=2", "device=cpu", "precision=fp32")
    assert p.tuning["source"]["kind"] == "static" and "CPU run" in p.tuning["source"]["reason"]
    assert "not chosen by the memory plan" in p.tuning["micro_batch_size"]  # no device memory: no auto


def test_a_search_winner_replaces_the_entry_of_its_workload(store):
    path, e = store
    bests.record([{**e, "tokens_per_s": 1.0}])
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 1 and entries[0]["tokens_per_s"] == 1.0


def test_the_shipped_store_is_what_the_recorded_searches_give(monkeypatch):
    """bench/plan/bests.json is `python -m bench.plan.bests results/`: every tune.json under results/, each winner an
    entry with the device nvidia-smi named (run it again after recording a search there)."""
    shipped = json.loads(bests.SHIPPED.read_text())["entries"]
    monkeypatch.chdir(REPO)
    assert bests.build([Path("results")]) == shipped
    devices = {e["workload"]["device"] for e in shipped}
    assert devices == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"} and len(shipped) == 37
    assert all(e["tokens_per_s"] > 0 and e["peak_memory_mb"] > 0 for e in shipped)


# ------------------------------------------------------------------------------ never worse for memory
def test_tuning_never_makes_a_fitting_run_predict_out_of_memory(tmp_path):
    """The static profile's units of 8 blocks without resharding, at micro-batch 8, planned 146 GiB on an 80 GB
    H100; micro_batch_size=auto and the memory check leave a plan that fits (a real dry run: exit 0)."""
    p = plan("tuning=best", *LLAMA_8B)
    assert memory_plan(p)["fits"] is True and p.tuning["applied"]["strategy.micro_batch_size"]["value"] == "auto"
    assert p.micro_batch_size < 8 and p.micro_batch_auto["chosen"] == p.micro_batch_size
    r = run_bench("tuning=best", *LLAMA_8B, run_dir=tmp_path / "r", timeout=120)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    saved = json.loads((tmp_path / "r" / "plan.json").read_text())
    assert saved["fits"] and saved["micro_batch_size_auto"]["chosen"] == saved["config"]["strategy"]["micro_batch_size"]


def test_a_setting_that_would_not_fit_is_skipped_with_the_plans_numbers():
    """At the user's micro-batch 4 (gradients reduce-scattered after each micro-batch) in 80 GiB, units of 8 blocks
    and keeping the gathered parameters to backward do not fit or are too close to the limit to tell (tight), the
    run without them fits: skipped, the memory plan's numbers as the reason; compile applied."""
    p = plan("tuning=best", *LLAMA_8B, "strategy.micro_batch_size=4", "strategy.sync_every_microbatch=true",
             "memory_gib=80", explicit=["strategy.micro_batch_size", "strategy.sync_every_microbatch", "memory_gib"])
    for key in ("strategy.blocks_per_unit", "strategy.reshard_after_forward"):
        reason = p.tuning["skipped"][key]["reason"]
        assert ("predicts an out-of-memory with it (predicted peak" in reason or "is tight with it (predicted peak"
                in reason) and "without it" in reason, reason
    assert (p.strategy.reshard_after_forward, p.strategy.blocks_per_unit, p.cfg["compile"]) == (True, 1, True)
    assert memory_plan(p)["fits"] is True and p.micro_batch_size == 4


# ------------------------------------------------------------------------------ micro_batch_size=auto
def _largest_that_fits(*overrides: str) -> int:
    per_rank = plan(*overrides).micro_batch_size  # null: the whole per-rank batch
    for b in sorted((d for d in range(1, per_rank + 1) if per_rank % d == 0), reverse=True):
        mem = memory_plan(plan(*overrides, f"strategy.micro_batch_size={b}"))
        if mem["fits"] and not mem["tight"]:
            return b
    raise AssertionError("nothing fits")


@pytest.mark.parametrize("overrides", [(*LLAMA_8B, "strategy.sync_every_microbatch=true"),
                                       ("model=300m", "device=cpu", "memory_gib=12")],
                         ids=["hardware_preset", "memory_gib"])
def test_auto_picks_the_largest_micro_batch_that_fits(overrides):
    want = _largest_that_fits(*overrides)
    p = plan(*overrides, "strategy.micro_batch_size=auto")
    per_rank = p.micro_batch_size * p.grad_accum
    assert 1 < want < per_rank and (p.micro_batch_size, p.strategy.micro_batch_size) == (want, want)
    a = p.micro_batch_auto
    assert a["chosen"] == want and a["grad_accum"] == per_rank // want and a["per_rank_batch"] == per_rank
    first = a["tried"][0]  # the whole per-rank batch did not fit, or only within the plan's error
    assert first["micro_batch_size"] == per_rank and (first["fits"] is False or first["tight"])
    assert "the largest that fits" in a["reason"]


def test_auto_on_cpu_without_a_memory_limit_takes_the_whole_per_rank_batch():
    p = plan("strategy=ddp", "world_size=2", "device=cpu", "strategy.micro_batch_size=auto")
    assert (p.micro_batch_size, p.grad_accum) == (4, 1) and "no device memory to plan against" in \
        p.micro_batch_auto["reason"]
    with pytest.raises(ConfigError) as e:  # pipelines: strategy.microbatches sets the micro-batches
        plan("strategy=pp", "strategy.impl=torch", "world_size=2", "device=cpu", "strategy.micro_batch_size=auto")
    assert e.value.key == "strategy.micro_batch_size" and "conflicts with strategy.microbatches" in str(e.value)


def test_auto_runs_and_metrics_say_what_it_chose(bench_run):
    p, d = bench_run(*CPU_FAST, "strategy.micro_batch_size=auto", "memory_gib=0.23")  # the whole batch: 0.25 GiB
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    auto = m["layout"]["micro_batch_size_auto"]
    assert auto["chosen"] == m["layout"]["micro_batch_size"] == m["config"]["strategy"]["micro_batch_size"] < 8
    assert "strategy.micro_batch_size=auto: " in p.stdout + p.stderr


# ------------------------------------------------------------------------------ the search
def test_micro_batch_size_is_searched_where_the_micro_batches_are_not_set():
    from bench.sweep.search import tunables

    cfg = plan("strategy=pp", "strategy.impl=torch", "world_size=2", "device=cpu").cfg
    found = {k: (v, needs) for k, v, needs in tunables(cfg, set())}
    assert found["strategy.micro_batch_size"] == ((1, 2, 4, 8), {"strategy.microbatches": None})
    assert "strategy.micro_batch_size" not in {k for k, _, _ in tunables(cfg, {"strategy.microbatches"})}


def test_search_orders_by_prediction_and_drops_the_predicted_losers(tmp_path):
    """A dry-run search planned for an H100: the default first, the rest by predicted tokens/s; those predicted
    below 70% of the best predicted are not run, and tune.json and the log say how many and why."""
    sweep = tmp_path / "sweep"
    r = run_bench("+experiment=tune", *FSDP_300M, "world_size=1", "dry_run=true", "hardware=h100_sxm_80gb",
                  run_dir=sweep, multirun=True, timeout=120, env={"BENCH_BESTS": str(tmp_path / "bests.json")})
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    tune = json.loads((sweep / "tune.json").read_text())
    trials = tune["bases"][0]["trials"]
    dropped = [t for t in trials if t.get("status") == "dropped"]
    best = max(t["predicted_tokens_per_s"] for t in trials if t.get("predicted_tokens_per_s"))
    assert dropped and tune["dropped_by_prediction"] == tune["bases"][0]["dropped_by_prediction"] == len(dropped)
    assert all(t["predicted_tokens_per_s"] < 0.7 * best and "below 70%" in t["dropped"] for t in dropped)
    assert f"{len(dropped)} dropped as predicted below 70% of it" in out
    where = {t["name"]: out.find(" ".join(t["overrides"]) + " warmup_steps=4 steps=10: run") for t in trials}
    order = sorted((t for t in trials if where[t["name"]] >= 0), key=lambda t: where[t["name"]])
    assert len(order) >= 3 and not {t["name"] for t in order} & {t["name"] for t in dropped}
    assert order[0]["name"] == "default"
    assert [t["predicted_tokens_per_s"] for t in order[1:]] == sorted((t["predicted_tokens_per_s"] for t in order[1:]),
                                                                       reverse=True)
    assert any(t["name"].startswith("strategy.micro_batch_size=") for t in trials)

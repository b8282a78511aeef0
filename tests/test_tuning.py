"""tuning=best: each strategy's profile applied honestly (bench/run/tuning_profiles.py), and the top-level shorthands.

What is applied, kept (set explicitly) and skipped (cannot apply here) is checked on composed configs;
real 2-rank gloo runs check that the applied knobs train the same model as strategy=single (fp32) and
that metrics.json's layout.tuning says what was applied and skipped."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from bench.run.config import register_configs, validate
from bench.spec.schema import ConfigError
from tests.conftest import CPU_FAST, REPO, loss_curve, metrics_of, run_bench

register_configs()


def plan(*overrides: str, gpus: int = 0, explicit=()):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=list(overrides)), gpus=gpus, explicit=explicit)


def test_default_tuning_changes_nothing():
    p = plan("strategy=zero", "zero_stage=2", "world_size=2", "device=cpu")
    assert p.tuning is None and p.strategy.compute_grad_norm is True and p.cfg["tuning"] == "default"


def test_best_on_a_gpu_applies_the_zero_profile():
    p = plan("strategy=zero", "zero_stage=2", "precision=bf16", "device=cuda", "tuning=best", gpus=1)
    applied = p.tuning["applied"]
    assert set(applied) == {"strategy.autocast", "compile", "compile_mode", "strategy.compute_grad_norm", "allocator"}
    assert p.cfg["allocator"] == "expandable_segments"  # every strategy's entry, after its own profile
    assert (p.strategy.autocast, p.cfg["compile"], p.cfg["compile_mode"], p.strategy.compute_grad_norm) == \
        (True, True, "reduce-overhead", False)
    assert all("results/" in v["evidence"] for v in applied.values())
    assert "leaf_blocks" in p.tuning["skipped"]["strategy.leaf_blocks"]["reason"]  # a ZeRO-3 knob at stage 2


def test_best_skips_what_cannot_apply_on_cpu_and_says_why():
    p = plan("strategy=zero", "zero_stage=1", "world_size=2", "device=cpu", "precision=fp32", "tuning=best")
    sk = p.tuning["skipped"]
    assert "bf16 or fp16" in sk["strategy.autocast"]["reason"]  # fp32 run
    assert "need a GPU" in sk["compile_mode"]["reason"] and "compile" not in sk  # CUDA graphs; compiling runs
    assert "on CPU" in sk["allocator"]["reason"] and p.cfg["allocator"] == "default"  # a CUDA allocator setting
    assert set(p.tuning["applied"]) == {"compile", "strategy.compute_grad_norm"}
    assert p.strategy.compute_grad_norm is False and p.cfg["compile"] is True
    p = plan("strategy=zero", "zero_stage=1", "world_size=2", "device=cpu", "precision=fp32", "tuning=best",
             "optim.grad_clip=1.0")  # clipping needs the norm: skipped, with the rule's own message
    assert "clipping needs the gradient norm" in p.tuning["skipped"]["strategy.compute_grad_norm"]["reason"]
    p = plan("strategy=megatron", "world_size=2", "device=cuda", "precision=bf16", "tuning=best", gpus=2)
    assert p.strategy.cuda_graph is True and p.strategy.use_distributed_optimizer is True


def test_best_skips_what_its_measurements_do_not_cover():
    """A profile entry's own condition: measured where it holds, skipped with the reason where not."""
    p = plan("strategy=megatron", "world_size=1", "device=cuda", "precision=bf16", "tuning=best", gpus=1)
    assert p.strategy.cuda_graph is True and p.strategy.use_distributed_optimizer is False
    assert "data-parallel size 1" in p.tuning["skipped"]["strategy.use_distributed_optimizer"]["reason"]
    p = plan("strategy=ddp", "world_size=1", "device=cuda", "precision=bf16", "tuning=best", gpus=1)
    assert (p.cfg["compile"], p.cfg["compile_mode"]) == (True, "reduce-overhead") and not p.tuning["skipped"]
    p = plan("strategy=ddp", "world_size=2", "device=cuda", "precision=bf16", "tuning=best", gpus=2)
    assert (p.cfg["compile"], p.cfg["compile_mode"]) == (False, "default")
    assert "measured on 1 rank only" in p.tuning["skipped"]["compile"]["reason"]
    p = plan("strategy=single", "device=cpu", "precision=fp32", "tuning=best")  # CUDA graphs need a GPU
    assert p.cfg["compile"] is True and "need a GPU" in p.tuning["skipped"]["compile_mode"]["reason"]


GRAPHED = ("device=cuda", "compile=true", "compile_mode=reduce-overhead", "model.global_batch=8")


@pytest.mark.parametrize("strategy", [("strategy=single",), ("strategy=ddp",), ("strategy=zero", "zero_stage=0"),
                                      ("strategy=zero", "zero_stage=1")], ids=lambda s: " ".join(s))
def test_cuda_graphs_across_micro_batches_are_refused_where_gradients_accumulate(strategy):
    """One H100, Llama 3.2 1B, 2 micro-batches a step: DDP at one rank and ZeRO-1 failed in their first step under
    CUDA graphs (results/2026-12-06-h100x1-graphs-and-host); refused before launch, naming the micro-batches."""
    with pytest.raises(ConfigError) as e:
        plan(*strategy, *GRAPHED, "strategy.micro_batch_size=4", gpus=1)
    assert e.value.key == "compile_mode" and "2 micro-batches a step" in str(e.value)
    p = plan(*strategy, *GRAPHED, "strategy.micro_batch_size=8", gpus=1)  # one micro-batch: graphs run
    assert p.grad_accum == 1 and p.cfg["compile_mode"] == "reduce-overhead"


H100_1B = ("model=llama3_1b", "recompute=none", "device=cuda", "dry_run=true", "hardware=h100_sxm_80gb")


def test_zero2_keeps_cuda_graphs_across_micro_batches_and_best_skips_them_elsewhere():
    """ZeRO-2 moves every gradient out each micro-batch (it ran with 2).  ZeRO-1 on an H100: graphs need the whole
    batch of 8 in one micro-batch, which the memory plan calls tight beside the graphs' pool, so tuning=best skips
    them for memory, not for the micro-batch auto would have chosen without them."""
    p = plan("strategy=zero", "zero_stage=2", *GRAPHED, "strategy.micro_batch_size=4", gpus=1)
    assert p.grad_accum == 2 and p.cfg["compile_mode"] == "reduce-overhead"
    p = plan("strategy=zero", "zero_stage=1", *H100_1B, "tuning=best", gpus=1)
    assert p.cfg["compile_mode"] == "default"
    assert "the memory plan is tight with it" in p.tuning["skipped"]["compile_mode"]["reason"]


def test_auto_micro_batch_passes_over_what_the_rules_refuse():
    """micro_batch_size=auto with CUDA graphs where gradients accumulate (ZeRO-1 under autocast, batch 8): only
    micro-batch 2 fits outside the plan's error, but 4 micro-batches under graphs are refused, so auto takes 8, tight,
    and says why 2 was passed over (it used to choose 2, and validation failed)."""
    p = plan("strategy=zero", "zero_stage=1", "strategy.autocast=true", *H100_1B, *GRAPHED, "strategy.micro_batch_size=auto",
             gpus=1)
    a = p.micro_batch_auto
    assert (a["chosen"], p.grad_accum) == (8, 1) and "tight" in a["reason"]
    two = next(t for t in a["tried"] if t["micro_batch_size"] == 2)
    assert two["fits"] and not two["tight"] and "4 micro-batches a step" in two["refused"]
    p = plan("strategy=zero", "zero_stage=2", "strategy.autocast=true", *H100_1B, *GRAPHED, "strategy.micro_batch_size=auto",
             gpus=1)
    assert not any("refused" in t for t in p.micro_batch_auto["tried"])  # ZeRO-2 runs graphs over micro-batches


def test_an_explicit_setting_wins_over_the_profile():
    p = plan("strategy=fsdp", "world_size=2", "device=cpu", "precision=fp32", "tuning=best",
             "strategy.reshard_after_forward=true", explicit=["strategy.reshard_after_forward"])
    assert p.strategy.reshard_after_forward is True
    assert "set explicitly" in p.tuning["kept"]["strategy.reshard_after_forward"]["reason"]
    p = plan("strategy=fsdp", "world_size=2", "device=cpu", "precision=fp32", "tuning=best", "compile=false",
             explicit=["compile"])  # at its default, but typed: still the user's
    assert p.cfg["compile"] is False and "compile" in p.tuning["kept"]
    assert p.strategy.reshard_after_forward is False  # the rest of the profile applied
    assert "must be 1..4" in p.tuning["skipped"]["strategy.blocks_per_unit"]["reason"]  # tiny has 4 blocks


def test_shorthands_zero_stage_and_microbatches():
    assert plan("strategy=zero", "zero_stage=3", "world_size=2", "device=cpu").strategy.zero_stage == 3
    assert plan("strategy=zero", "+zero_stage=2", "world_size=2", "device=cpu").strategy.zero_stage == 2
    p = plan("strategy=pp", "strategy.impl=torch", "microbatches=p", "world_size=2", "device=cpu")
    assert (p.strategy.microbatches, p.grad_accum) == ("p", 2) and "microbatches" not in p.cfg
    for overrides, key in ((["strategy=single", "zero_stage=2"], "zero_stage"),
                           (["strategy=zero", "zero_stage=2", "strategy.zero_stage=1"], "strategy.zero_stage"),
                           (["strategy=zero", "+strategy.zero_stag=2"], "strategy.zero_stag"),
                           (["+not_a_key=1"], "not_a_key"),
                           (["strategy=ddp", "+model.n_kv=2"], "model.n_kv")):
        with pytest.raises(ConfigError) as e:
            plan(*overrides, "device=cpu")
        assert e.value.key == key, overrides


def test_grad_reduce_sets_each_strategys_own_knob_or_fails_naming_it():
    """grad_reduce=fp32 | 16bit: one run-level choice, set on each strategy's knob (the record keeps only that knob);
    a strategy that sums nothing, a contradicting explicit knob, or a strategy rule's refusal of the value it sets is
    an error naming grad_reduce (or the contradicting key) before launch."""
    bf16 = ("precision=bf16", "world_size=2")
    for strategy, choice, key, value in (("ddp", "fp32", "comm_hook", "none"), ("fsdp", "16bit", "reduce_dtype", "param"),
                                         ("fsdp", "fp32", "reduce_dtype", "fp32"), ("zero", "fp32", "reduce_dtype", "fp32"),
                                         ("zero", "16bit", "reduce_dtype", "param")):
        p = plan(f"strategy={strategy}", f"grad_reduce={choice}", *bf16, "device=cpu")
        assert getattr(p.strategy, key) == value and "grad_reduce" not in p.cfg, (strategy, choice)
    # on a GPU, DDP's 16 bit is its compress hook in the run's own 16-bit dtype
    for precision, hook in (("bf16", "bf16_compress"), ("fp16", "fp16_compress")):
        p = plan("strategy=ddp", "grad_reduce=16bit", f"precision={precision}", "world_size=2", "device=cuda", gpus=2)
        assert p.strategy.comm_hook == hook
    p = plan("strategy=megatron", "grad_reduce=16bit", "world_size=2", "device=cuda", gpus=2)
    assert p.strategy.grad_reduce_in_fp32 is False
    # tuning=best keeps it (an explicit setting)
    p = plan("strategy=zero", "zero_stage=0", "grad_reduce=fp32", "precision=bf16", "device=cuda", "tuning=best", gpus=1)
    assert p.strategy.reduce_dtype == "fp32" and p.strategy.autocast is True
    for stage in (0, 2):  # under torch_autocast: the engine's dtype (stage 0), every module's comm_dtype (1-3)
        assert plan("strategy=zero", f"zero_stage={stage}", "strategy.autocast=true", "grad_reduce=16bit",
                    *bf16, "device=cpu").strategy.reduce_dtype == "param"
    for overrides, key, words in (
            (["strategy=single", "grad_reduce=fp32", "world_size=1"], "grad_reduce", "sums no gradients"),
            (["strategy=fsdp", "grad_reduce=16bit", "strategy.reduce_dtype=fp32", *bf16], "strategy.reduce_dtype",
             "contradicts grad_reduce=16bit"),
            (["strategy=fsdp", "grad_reduce=16bit", "precision=fp32", "world_size=2"], "grad_reduce",
             "sets strategy.reduce_dtype=param here, and takes effect only with precision=bf16"),
            (["strategy=ddp", "grad_reduce=half", *bf16], "grad_reduce", "valid: default, fp32, 16bit")):
        with pytest.raises(ConfigError) as e:  # the keys set, as the command line passes them
            plan(*overrides, "device=cpu", explicit=[o.split("=", 1)[0] for o in overrides])
        assert e.value.key == key and words in str(e.value), (overrides, str(e.value))


def test_unconsumed_plus_key_fails_before_launch(tmp_path):
    p = run_bench(*CPU_FAST, "strategy=zero", "+strategy.zero_stag=2", run_dir=tmp_path / "r", timeout=120)
    assert p.returncode == 2 and "strategy.zero_stag=2: bench does not use this key" in p.stdout + p.stderr
    assert not list((tmp_path / "r").glob("rank*.json"))


def test_zero_stage_shorthand_runs_as_typed(single_cpu, bench_run):
    """python -m bench strategy=zero zero_stage=3 world_size=2: ZeRO-3 ran, and says so."""
    p, d = bench_run(*CPU_FAST, "strategy=zero", "zero_stage=3", "world_size=2")
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    assert m["layout"]["zero_stage"] == 3 == m["config"]["strategy"]["zero_stage"]
    assert m["layout"]["ds_config"]["zero_optimization"]["stage"] == 3 and "zero_stage" not in m["config"]
    assert max(abs(a - b) for a, b in zip(loss_curve(d), loss_curve(single_cpu))) < 1e-5


@pytest.mark.parametrize("overrides", [
    ("strategy=zero", "zero_stage=1", "world_size=2"),  # compute_grad_norm=false applied
    ("strategy=zero", "zero_stage=3", "world_size=2"),  # leaf_blocks applied
    ("strategy=fsdp", "world_size=2", "compile=false"),  # reshard_after_forward=false applied, compile kept
    ("strategy=ddp", "world_size=2"),  # nothing applies: its profile was measured on one rank
    ("strategy=pp", "strategy.impl=torch", "world_size=2"),  # cuda_graph skipped (Megatron only)
    ("strategy=tp", "strategy.impl=torch", "world_size=2"),  # cuda_graph skipped (Megatron only)
    ("strategy=single", "compile=false"),  # its profile's compile=true: the command line wins
], ids=["zero1", "zero3", "fsdp", "ddp", "torch_pp", "torch_tp", "single"])
def test_best_trains_the_same_model(overrides, single_cpu, bench_run):
    p, d = bench_run(*CPU_FAST, "tuning=best", *overrides)
    assert p.returncode == 0, p.stderr[-3000:]
    m = metrics_of(d)
    tuning = m["layout"]["tuning"]
    assert tuning["profile"] == "best" and set(tuning) >= {"applied", "skipped", "kept", "summary"}
    assert max(abs(a - b) for a, b in zip(loss_curve(d), loss_curve(single_cpu))) < 1e-5
    if "zero_stage=1" in overrides:
        assert m["config"]["strategy"]["compute_grad_norm"] is False
    if "zero_stage=3" in overrides:
        assert m["layout"]["ds_config"]["zero_optimization"]["leaf_module"]
    if "strategy=fsdp" in overrides or "strategy=single" in overrides:
        assert "compile" in tuning["kept"] and m["config"]["compile"] is False
    if "strategy=fsdp" in overrides:
        assert m["layout"]["reshard_after_forward"] is False
    assert tuning["summary"] in p.stdout + p.stderr  # said in the log too


def test_the_record_says_what_the_planners_search_set_not_the_profiles_value():
    """tuning=best then the planner's search (bench/planner/resolve.py): where the search replaces a value the
    profile applied (FSDP2's resharding for Llama-3 8B's width on one H200: the profile leaves it off, the search
    turns it on), layout.tuning.applied and its summary say what runs, naming the profile's value, as the run of
    results/2026-12-05-h200x1-torchtitan-peer did not."""
    from bench.planner.resolve import resolved

    base = plan("tuning=best", "model=llama3_8b", "model.n_layers=12", "model.global_batch=4", "strategy=fsdp",
                "world_size=1", "precision=bf16", "compile=true", "recompute=none", "hardware=h200_141gb",
                "device=cuda", "dry_run=true", gpus=1, explicit=["compile", "recompute", "precision"])
    assert base.tuning["applied"]["strategy.reshard_after_forward"]["value"] is False
    p = resolved(base, ["compile", "recompute", "precision"], gpus=1)
    changes = {k: v for k, v in p.tuning["planner"]["changes"].items() if v is not None}
    assert changes.get("strategy.reshard_after_forward") is True and p.strategy.reshard_after_forward is True
    applied = p.tuning["applied"]
    for k, v in changes.items():
        assert applied[k]["value"] == v and applied[k]["evidence"].startswith("the planner's search"), (k, applied[k])
    assert "the profile's strategy.reshard_after_forward=False" in applied["strategy.reshard_after_forward"]["evidence"]
    assert "strategy.reshard_after_forward=True" in p.tuning["summary"]
    assert "strategy.reshard_after_forward=False" not in p.tuning["summary"]

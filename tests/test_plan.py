"""The memory plan before launch (bench/plan/memory_model.py): dry_run=true for every strategy (nothing spawned),
predicted OOMs skipped in sweeps without starting a process, and the plan's formulas."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from bench.run.config import register_configs, validate
from bench.plan.memory_model import memory_plan
from bench.metrics.flops import total_params
from bench.spec.schema import ModelConfig, typed
from tests.conftest import CPU_FAST, REPO, run_bench

register_configs()
GIB = 2**30


def plan(*overrides: str, gpus: int = 0):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=list(overrides)), gpus=gpus)


CPU_STRATEGIES = {
    "single": ["strategy=single"], "ddp": ["strategy=ddp", "world_size=2"],
    "zero": ["strategy=zero", "zero_stage=3", "world_size=2"], "fsdp": ["strategy=fsdp", "world_size=2"],
    "tp": ["strategy=tp", "strategy.impl=torch", "world_size=2"],
    "pp": ["strategy=pp", "strategy.impl=torch", "world_size=2"],
}


@pytest.mark.parametrize("name", list(CPU_STRATEGIES))
def test_dry_run_prints_and_writes_the_plan_and_spawns_nothing(name, tmp_path):
    d = tmp_path / "r"
    p = run_bench(*CPU_FAST, "dry_run=true", "model=llama_tiny", *CPU_STRATEGIES[name], run_dir=d, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "plan: model=llama_tiny" in out and "predicted peak" in out
    plan_json = json.loads((d / "plan.json").read_text())
    mem = plan_json["memory"]
    assert mem["parameters"] == total_params(typed(ModelConfig, plan_json["config"]["model"]))
    assert mem["predicted_peak_allocated_mb"] > 0 and mem["flops_per_token"] > 0
    assert not (d / "metrics.json").exists() and not list(d.glob("rank*"))  # no run, no rank


def test_megatron_is_planned_without_a_gpu_process():
    """Megatron needs CUDA to run, not to be planned: the plan of a 2-GPU TP layout, from validate alone."""
    mem = memory_plan(plan("strategy=tp", "world_size=2", "device=cuda", "model=llama3_1b", gpus=2))
    assert mem["layout"]["tp"] == 2 and mem["model_states"]["scheme"] == "megatron_mixed"


def test_dry_run_of_a_plan_that_does_not_fit_exits_3(tmp_path):
    p = run_bench(*CPU_FAST, "dry_run=true", "memory_gib=0.05", run_dir=tmp_path / "r", timeout=120)
    assert p.returncode == 3 and "predicted OOM (needs" in p.stdout + p.stderr


def test_sweep_skips_predicted_ooms_without_starting_them(tmp_path):
    d = tmp_path / "sweep"
    p = run_bench(*CPU_FAST, "strategy=ddp", "world_size=2", "memory_gib=0.05,64", run_dir=d, multirun=True,
                  timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "skipped=1" in out and "completed=1" in out
    by = {json.loads((d / j / "metrics.json").read_text())["status"]: d / j for j in ("0", "1")}
    skipped = by["skipped"]
    m = json.loads((skipped / "metrics.json").read_text())
    assert m["error"]["type"] == "PredictedOOM" and "predicted OOM (needs" in m["error"]["message"]
    assert "of 0.05:" in m["error"]["message"]
    assert m["memory"]["plan"]["fits"] is False and not list(skipped.glob("rank*"))
    done = json.loads((by["completed"] / "metrics.json").read_text())
    assert done["memory"]["plan"]["predicted_peak_allocated_mb"] > 0  # predicted beside measured


def test_force_run_runs_a_predicted_oom(tmp_path):
    p = run_bench(*CPU_FAST, "memory_gib=0.05", "force_run=true", run_dir=tmp_path / "r", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]


def test_the_plans_parts_follow_the_layout():
    base = ("model=llama3_8b", "device=cuda", "precision=bf16", "memory_gib=139")
    one = memory_plan(plan(*base, "strategy=single", gpus=1))
    assert one["fits"] is False  # 16 bytes / parameter alone: 128 GB > a 139 GiB H200 with activations
    z3 = memory_plan(plan(*base, "strategy=zero", "zero_stage=3", "world_size=8", gpus=8))
    assert z3["model_states"]["device_mb"]["optimizer"] == pytest.approx(
        one["model_states"]["device_mb"]["optimizer"] * 12 / 8 / 8, rel=0.01)  # mixed 12 B/param / dp vs fp32 8
    full = memory_plan(plan(*base, "strategy=single", "recompute=full", gpus=1))
    assert full["activations"]["activations_mb"] < one["activations"]["activations_mb"] / 5
    sel = memory_plan(plan(*base, "strategy=single", "recompute=selective", gpus=1))
    assert sel["activations"]["activations_mb"] == one["activations"]["activations_mb"]  # fused attention: same
    tp = memory_plan(plan(*base, "strategy=tp", "world_size=2", gpus=2))
    pp = memory_plan(plan(*base, "strategy=pp", "world_size=2", "microbatches=4p", gpus=2))
    assert tp["parameters_on_rank"] < one["parameters_on_rank"] * 0.6
    assert pp["activations"]["microbatches_in_flight"] == 2 and pp["peak_stage"] in ("first", "last")
    # ZeRO-3 holds its whole reduce bucket (DeepSpeed allocates reduce_bucket_size elements at start), in the
    # parameters' dtype, +2 B per element under autocast
    def z3_buffers(*o):
        return memory_plan(plan(*base, "strategy=zero", "zero_stage=3", "world_size=8", *o, gpus=8))["buffers_mb"]
    small = z3_buffers("strategy.reduce_bucket_size=5e7")
    assert z3_buffers() - small == pytest.approx(4.5e8 * 2 / 2**20, abs=1)
    assert z3_buffers("strategy.autocast=true") - z3_buffers("strategy.autocast=true", "strategy.reduce_bucket_size=5e7") \
        == pytest.approx(4.5e8 * 6 / 2**20, abs=1)
    longer = memory_plan(plan(*base, "strategy=single", "model.seq_len=8192", gpus=1))
    assert longer["activations"]["activations_mb"] > 3.5 * one["activations"]["activations_mb"] / 1  # 4x tokens / step


# ------------------------------------------------------------------------------ the plan's terms, formula by formula
from bench.costs.activations import activation_bytes, layer_activation_bytes, params_per_rank  # noqa: E402
from bench.plan.memory_model import CUBLAS_WORKSPACE_BYTES, PROBE_BYTES  # noqa: E402
from bench.metrics.flops import param_groups  # noqa: E402
from bench.strategies.registry import get_spec  # noqa: E402

MIB = 2**20
GPU = ("device=cuda", "precision=bf16", "model=300m")


def _lay(p):
    return get_spec(p.strategy.name).model_states(p.run)


def _mem(*o, gpus=1):
    return memory_plan(plan(*GPU, *o, gpus=gpus))


def test_a_layer_saves_each_tensor_once_and_autocast_casts_per_projection():
    """gpt under eager autocast, per token: fp32 inputs of the two LayerNorms (8d), one 16-bit cast per projection
    reading them (q, k, v, fc_in: 8d), q / k / v and the attention output o_proj reads as its input (one tensor:
    8d), fc_in's output and GELU's (4 d_ff); compiled, Inductor casts each norm's output once (4d less)."""
    p = plan(*GPU, "strategy=single", gpus=1)
    d, ff = p.model.d_model, p.model.d_ff
    assert layer_activation_bytes(p, 1, _lay(p))["per_token"] == 8 * d + 8 * d + 8 * d + 4 * ff
    c = plan(*GPU, "strategy=single", "compile=true", gpus=1)
    assert layer_activation_bytes(c, 1, _lay(c))["per_token"] == 8 * d + 4 * d + 8 * d + 4 * ff
    # torch-native TP casts the attention's and the MLP's inputs once too (bench/parallel/tp.py)
    t = plan(*GPU, "strategy=tp", "strategy.impl=torch", "world_size=2", gpus=2)
    assert layer_activation_bytes(t, 1, _lay(t))["per_token"] == 8 * d + 4 * d + (8 * d + 4 * ff) / 2


def test_llama_compiled_recomputes_silu_and_megatron_sequence_parallel_splits_the_norms():
    p = plan("device=cuda", "precision=bf16", "model=llama3_1b", "strategy=single", gpus=1)
    c = plan("device=cuda", "precision=bf16", "model=llama3_1b", "strategy=single", "compile=true", gpus=1)
    ff = p.model.d_ff
    eager, compiled = (layer_activation_bytes(x, 1, _lay(x))["per_token"] for x in (p, c))
    assert eager - compiled == 6 * p.model.d_model + 2 * ff  # 3 casts fewer, silu(gate) not saved
    tp = plan(*GPU, "strategy=tp", "world_size=2", gpus=2)
    sp = plan(*GPU, "strategy=tp", "world_size=2", "strategy.sequence_parallel=true", gpus=2)
    d = tp.model.d_model
    assert layer_activation_bytes(tp, 1, _lay(tp))["per_token"] - layer_activation_bytes(sp, 1, _lay(sp))["per_token"] \
        == (4 * d + 4 * d) / 2  # 16-bit norm inputs and projection inputs, halved over tp=2


def test_the_loss_holds_12_bytes_per_logit_and_megatron_6():
    """torch cross entropy in fp32: log-softmax output, its gradient and the logits' fp32 gradient; Megatron's
    vocab-parallel cross entropy works in place on one fp32 copy, whose 16-bit cast flows back."""
    p = plan(*GPU, "strategy=single", gpus=1)
    tokens, V = p.micro_batch_size * p.model.seq_len, p.model.vocab_size
    assert activation_bytes(p, _lay(p))["logits"] == tokens * V * 12
    m = plan(*GPU, "strategy=megatron", gpus=1)
    assert activation_bytes(m, _lay(m))["logits"] == m.micro_batch_size * m.model.seq_len * V * 6


def test_autocast_copies_of_the_weights_are_saved_for_backward():
    """2 B per matmul parameter under autocast (none with 16-bit weights: FSDP2, DeepSpeed's own bf16, Megatron);
    with full recompute only the head's copy is saved, the blocks' come back one layer at a time."""
    p = plan(*GPU, "strategy=single", gpus=1)
    r = params_per_rank(p, False)
    assert activation_bytes(p, _lay(p))["weight_copies"] == 2 * (r["blocks"] + r["head"])
    for o in (("strategy=fsdp", "world_size=2"), ("strategy=zero", "world_size=2"), ("strategy=megatron",)):
        q = plan(*GPU, *o, gpus=2)
        assert activation_bytes(q, _lay(q))["weight_copies"] == 0
    full = plan(*GPU, "strategy=single", "recompute=full", gpus=1)
    a = activation_bytes(full, _lay(full))
    assert a["weight_copies"] == 2 * r["head"] and a["recomputed_layer"] > a["per_layer_per_microbatch"]


def test_cublas_workspace_and_rank_0s_matmul_probe():
    """The probe's two 8192^2 bf16 matrices and their product are in a tiny run's max_memory_allocated."""
    tiny = _mem("model=10m", "strategy=single", "model.global_batch=1")
    assert tiny["predicted_peak_allocated_mb"] == pytest.approx((PROBE_BYTES + CUBLAS_WORKSPACE_BYTES) / MIB, abs=0.1)
    off = _mem("model=10m", "strategy=single", "model.global_batch=1", "metrics.measure_matmul_peak=false")
    assert off["predicted_peak_allocated_mb"] < tiny["predicted_peak_allocated_mb"] / 2
    cpu = memory_plan(plan("model=10m", "strategy=single", "device=cpu", "precision=fp32"))
    gpu = _mem("model=10m", "strategy=single", "precision=fp32", "metrics.measure_matmul_peak=false")
    assert gpu["predicted_peak_allocated_mb"] - cpu["predicted_peak_allocated_mb"] == pytest.approx(32, abs=0.1)


def test_ddp_buckets_only_on_several_ranks():
    """dp > 1: the gradients are views into the reducer's buckets (alive through the forward: 4 B/param) and step
    2's rebuild keeps step 1's buckets a while (4 B/param more); one rank wraps nothing: single's plan."""
    one, single = _mem("strategy=ddp", "world_size=1"), _mem("strategy=single")
    assert one["buffers_mb"] == 0 and one["predicted_peak_allocated_mb"] == single["predicted_peak_allocated_mb"]
    two = _mem("strategy=ddp", "world_size=2", "model.global_batch=16", gpus=2)
    psi = two["parameters_on_rank"]
    assert two["buffers_mb"] == pytest.approx(4 * psi / MIB, abs=0.1)
    assert two["predicted_peak_allocated_mb"] - single["predicted_peak_allocated_mb"] == pytest.approx(8 * psi / MIB, abs=1)
    copies = _mem("strategy=ddp", "world_size=2", "model.global_batch=16", "strategy.gradient_as_bucket_view=false",
                  gpus=2)
    assert copies["buffers_mb"] == pytest.approx(8 * psi / MIB, abs=0.1)


def test_zero_reduce_buckets_live_in_backward_whole_and_per_dtype():
    """Stages 1-2: reduce_bucket_size elements however small the model, in the parameters' dtype, x2 with
    overlap_comm, one per communication dtype under torch_autocast (16-bit Linear, fp32 rest); none without
    contiguous_gradients; beside the activations, not the logits; compiled, beside the gradients instead."""
    def bwd(*o):
        return _mem("strategy=zero", "world_size=2", *o, gpus=2)["phase_buffers_mb"]["backward"]
    n = 5e8
    assert bwd("zero_stage=1") == pytest.approx(n * 2 / MIB, abs=0.1)
    assert bwd("zero_stage=2", "strategy.overlap_comm=true") == pytest.approx(2 * n * 2 / MIB, abs=0.1)
    assert bwd("zero_stage=1", "strategy.autocast=true") == pytest.approx(2 * n * 4 / MIB, abs=0.1)
    assert bwd("zero_stage=1", "strategy.contiguous_gradients=false") == 0
    raw = _mem("strategy=zero", "zero_stage=1", "+strategy.ds_config.torch_autocast.enabled=true",
               "+strategy.ds_config.bf16.enabled=false")
    assert raw["phase_buffers_mb"]["backward"] == pytest.approx(2 * n * 4 / MIB, abs=0.1)  # ds_config's autocast
    z0, z1 = (_mem("strategy=zero", f"zero_stage={z}", "model.global_batch=16") for z in (0, 1))
    assert z1["predicted_peak_allocated_mb"] == z0["predicted_peak_allocated_mb"]  # the logits' buffers are larger
    big = _mem("strategy=zero", "zero_stage=1", "model.global_batch=16", "strategy.reduce_bucket_size=5e9")
    assert big["predicted_peak_allocated_mb"] > z0["predicted_peak_allocated_mb"] + 5e9 * 2 / MIB * 0.8
    # compiled (one graph), the buckets come with the gradients at the end of backward, not with the activations
    small = ("model.global_batch=2", "strategy.autocast=true", "strategy.overlap_comm=true")
    eager, compiled = (_mem("strategy=zero", "zero_stage=1", *small, *c) for c in ((), ("compile=true",)))
    psi = compiled["parameters_on_rank"]
    late = (compiled["model_states"]["device_mb"]["params"] + compiled["model_states"]["device_mb"]["optimizer"]
            + 4 * psi / MIB + 4 * 5e8 * 4 / MIB + CUBLAS_WORKSPACE_BYTES / MIB)
    assert compiled["predicted_peak_allocated_mb"] == pytest.approx(late, abs=1)
    assert eager["predicted_peak_allocated_mb"] > compiled["predicted_peak_allocated_mb"]


def test_zero_step_and_zero3_terms():
    """The step's flattened gradient partition and its fp32 copy (6 B per partition element; ZeRO-3 one
    sub-group at a time); ZeRO-3's reduce buckets from initialize (6 B per element under autocast); its gathered
    parameters cost nothing on one rank, and on several stay gathered from forward to backward (300m: all)."""
    def m(*o, gpus=2):
        return _mem("strategy=zero", *o, gpus=gpus)
    two = m("zero_stage=2", "world_size=2")
    assert two["phase_buffers_mb"]["step"] == pytest.approx(6 * two["parameters_on_rank"] / 2 / MIB, abs=0.1)
    assert m("zero_stage=3", "world_size=2")["buffers_mb"] == pytest.approx(5e8 * 2 / MIB, abs=0.1)
    assert m("zero_stage=3", "world_size=2", "strategy.autocast=true")["buffers_mb"] == pytest.approx(5e8 * 6 / MIB, abs=0.1)
    assert m("zero_stage=3", "world_size=1", gpus=1)["phase_buffers_mb"]["pass"] == 0
    z3 = m("zero_stage=3", "world_size=2")
    assert z3["phase_buffers_mb"]["pass"] == pytest.approx(2 * z3["parameters_on_rank"] / MIB, abs=0.1)
    off = m("zero_stage=3", "world_size=2", "strategy.offload_optimizer=cpu", "strategy.offload_param=cpu")
    assert off["model_states"]["device_mb"]["grads"] == 0 and "step" not in off["phase_buffers_mb"]


def test_megatron_grad_buffers_and_pipeline_stages():
    """Megatron DDP's fp32 main-grad buffers are allocated at wrap (live through the forward); a 1F1B pipeline's
    last stage holds one micro-batch in flight and the logits, its first min(m, pp) micro-batches and no logits."""
    single_mb = _mem("strategy=megatron", "model.global_batch=8")
    acc = _mem("strategy=megatron", "model.global_batch=8", "strategy.micro_batch_size=4")
    assert acc["predicted_peak_allocated_mb"] < single_mb["predicted_peak_allocated_mb"]  # grads live in both
    p = plan(*GPU, "strategy=pp", "world_size=2", "microbatches=8", gpus=2)
    lay = _lay(p)
    first, last = (activation_bytes(p, lay, params_per_rank(p, lay.tp_splits_vocab, s)) for s in ("first", "last"))
    assert first["microbatches_in_flight"] == 2 and last["microbatches_in_flight"] == 1
    assert first["logits"] == 0 and last["logits"] > 0
    assert param_groups(p.model)["head"] == params_per_rank(p, lay.tp_splits_vocab, "last")["head"]


def test_fsdp_gathers_no_more_units_than_it_has():
    one = _mem("strategy=fsdp", "world_size=2", "strategy.blocks_per_unit=24", gpus=2)
    per_block = param_groups(plan(*GPU, gpus=1).model)["block"]
    root = one["parameters_on_rank"] - 24 * per_block  # embedding, final norm, head: the root never reshards
    assert one["buffers_mb"] == pytest.approx((24 * per_block * 2 + 2 * root) / MIB, rel=1e-3)
    # the unit's unsharded gradients (fp32 reduce-scatter input and the 16-bit ones copied into it, less its freed
    # gathered parameters) come after its backward (phase_buffers), not beside every activation
    assert one["phase_buffers_mb"]["reduce"] == pytest.approx(24 * per_block * (4 + 2 - 2) / MIB, rel=1e-3)


def test_fsdp_without_resharding_plans_a_units_reduce_scatter_input_after_its_backward():
    """Issue 50: FSDP2's post_backward frees the unit's gathered parameters, then foreach_reduce allocates the unit's
    gradients in reduce_dtype and copies autograd's 16-bit ones into it (bench/strategies/fsdp.py phase_buffers);
    with one unit of all 24 blocks and short sequences that moment is the peak, beside no block's activations."""
    o = ("strategy=fsdp", "world_size=2", "strategy.reshard_after_forward=false", "strategy.blocks_per_unit=24",
         "model.seq_len=64")
    fp32, param = _mem(*o, gpus=2), _mem(*o, "strategy.reduce_dtype=param", gpus=2)
    per_block = param_groups(plan(*GPU, gpus=1).model)["block"]
    assert fp32["phase_buffers_mb"]["reduce"] == pytest.approx(24 * per_block * (4 + 2 - 2) / MIB, rel=1e-3)
    assert param["phase_buffers_mb"]["reduce"] == pytest.approx(24 * per_block * (2 + 2 - 2) / MIB, rel=1e-3)
    states = fp32["model_states"]["device_mb"]  # + cuBLAS's workspace (32 MiB); the gradients come after the moment
    peak = states["params"] + states["optimizer"] + fp32["phase_buffers_mb"]["reduce"] + 32
    assert fp32["predicted_peak_allocated_mb"] == pytest.approx(peak, rel=1e-3)
    assert param["predicted_peak_allocated_mb"] < fp32["predicted_peak_allocated_mb"]


EDGE = ("+experiment=gpu_llama8b_x4", "dry_run=true", "hardware=h100_sxm_80gb")


@pytest.mark.parametrize("overrides, verdict", [
    # issue 43: out of memory at 74.6 GiB allocated + 3.25 GiB asked (FSDP2 keeps every fp32 gradient unsharded
    # between the 4 micro-batches), and Llama 3.2 3B DDP out of memory on the same 80 GB cards: neither "fits"; the
    # second was planned within the plan's error of the limit ("tight") until the plan counted DDP's first micro-batch's
    # own gradients beside the bucket views (bench/strategies/ddp.py phase_buffers): now above it
    (("+experiment/arm=fsdp", "strategy.micro_batch_size=1", "strategy.reshard_after_forward=false", "compile=true"),
     "does not fit"),
    (("+experiment/arm=ddp", "model=llama3_3b"), "does not fit"),
])
def test_the_edge_runs_that_ran_out_of_memory_do_not_fit(overrides, verdict):
    from bench.planner.evaluate import verdict_of

    mem = memory_plan(plan(*EDGE, *overrides))
    assert verdict_of(mem) == verdict and mem["needed_mb"] > 79.2 * 1024


def test_a_run_that_completed_just_above_the_planned_limit_is_tight_not_does_not_fit():
    """Issue 48: Llama-3 8B FSDP2 on 2 x H100 80GB, 4 x 1, full recompute, no reshard, units of 8 blocks, planned
    80.9 GiB needed, completed at 73.8 GiB allocated (77.6 reserved) when forced."""
    from bench.planner.evaluate import verdict_of

    mem = memory_plan(plan("model=llama3_8b", "strategy=fsdp", "world_size=2", "hardware=h100_sxm_80gb",
                           "dry_run=true", "model.seq_len=2048", "model.global_batch=8", "precision=bf16",
                           "strategy.micro_batch_size=4", "recompute=full", "strategy.reshard_after_forward=false",
                           "strategy.blocks_per_unit=8", "compile=true", gpus=0))
    assert mem["needed_mb"] > 79.2 * 1024 and verdict_of(mem) == "tight"

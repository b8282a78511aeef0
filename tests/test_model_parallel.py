"""Model parallelism: strategies tp / pp / megatron (one schema, layout tp x pp x dp).

CPU (gloo, real processes): torch-native TP, PP (GPipe, 1F1B, interleaved 1F1B) and 2D
layouts train bench's model with the per-step loss of strategy=single (fp32); megatron-core's
GPTModel built by bench (spec, TP split, PP/virtual split, bench's weights) computes bench's
loss and gradients on CPU (TP=2 and PP=2 x 2 virtual stages, forward by hand: Megatron's
schedules, DDP and optimizer need CUDA); the validation rules.
GPU (marked gpu / gpu2, skipped without GPUs): the full Megatron and torch-native runs against
strategy=single (all 15 passed on 2 H200s, torch 2.11, megatron-core 0.16.1, 2026-11-22:
`CUDA_DEVICE_MAX_CONNECTIONS=1 pytest -q tests/test_model_parallel.py -m "gpu or gpu2"`, ~5.5 min).
"""
from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.run.config import ConfigError, register_configs, validate
from bench.spec.schema import ModelConfig, OptimConfig, typed
from tests.conftest import CPU_FAST, REPO, c10d_threads_left, case_sweep, loss_curve, metrics_of, run_bench, spawn_ranks
from tests.megatron_by_hand import grads_as_model, run_virtual_pipeline_by_hand

register_configs()

TORCH = ["strategy.impl=torch"]


def _max_diff(a, b):
    assert len(a) == len(b) and None not in a and None not in b, (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


# --------------------------------------------------------------------------- torch-native on CPU
RUNS = {  # id -> (overrides, expected layout fields)
    "tp2": (["strategy=tp", *TORCH, "world_size=2"],
            dict(tp=2, pp=1, dp=1, pipeline_schedule=None, microbatches=1)),
    "pp2_gpipe": (["strategy=pp", *TORCH, "world_size=2", "strategy.schedule=gpipe"],
                  dict(tp=1, pp=2, dp=1, pipeline_schedule="ScheduleGPipe", microbatches=8)),
    "pp2_1f1b": (["strategy=pp", *TORCH, "world_size=2", "strategy.schedule=1f1b", "strategy.microbatches=p"],
                 dict(tp=1, pp=2, dp=1, pipeline_schedule="Schedule1F1B", microbatches=2, micro_batch_size=4)),
    "pp2_interleaved": (["strategy=pp", *TORCH, "world_size=2", "strategy.virtual_pipeline=2",
                         "strategy.microbatches=4"],
                        dict(tp=1, pp=2, dp=1, pipeline_schedule="ScheduleInterleaved1F1B", pipeline_stages=4)),
    "tp2_pp2": (["strategy=tp", *TORCH, "world_size=4", "strategy.pp=2", "strategy.microbatches=p"],
                dict(tp=2, pp=2, dp=1, pipeline_schedule="Schedule1F1B", microbatches=2)),
    # torch DDP over pipeline stages (DDP x PP), FSDP2 over a tensor-parallel model (FSDP x TP), and 3-D
    "pp2_dp2": (["strategy=pp", *TORCH, "world_size=4", "strategy.microbatches=p"],
                dict(tp=1, pp=2, dp=2, pipeline_schedule="Schedule1F1B", microbatches=2, micro_batch_size=2)),
    "fsdp_tp2_dp2": (["strategy=fsdp", "strategy.tp=2", "world_size=4"], dict(tp=2, pp=1, dp=2, micro_batch_size=4)),
    "fsdp_pp2_dp2": (["strategy=fsdp", "strategy.pp=2", "world_size=4", "microbatches=p"],
                     dict(tp=1, pp=2, dp=2, pipeline_schedule="Schedule1F1B", microbatches=2)),
    # torch.compile per block after DTensor TP (the cure for DTensor's eager dispatch cost)
    "tp2_compiled": (["strategy=tp", *TORCH, "world_size=2", "compile=true"],
                     dict(tp=2, pp=1, dp=1, compile="each transformer block (torch.compile), after TP")),
}


# one sweep for the two tests below (a module fixture: one unit for pytest-xdist, tests/conftest.py), each run
# against the sweep's own single run; 64 tokens a sequence (no check depends on the length; half the step time)
SEQ = 64
CLIP = "optim.grad_clip=0.1"
CASES = {"single": ("strategy=single",), **{run_id: tuple(overrides) for run_id, (overrides, _) in RUNS.items()},
         "single_clip": ("strategy=single", CLIP), "tp2_pp2_clip": (*RUNS["tp2_pp2"][0], CLIP)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Every case of CASES, one sweep (the runs one after another); {case: its run folder}."""
    return case_sweep(tmp_path_factory.mktemp("model_parallel"), CASES, *CPU_FAST, f"model.seq_len={SEQ}",
                      all_must_pass=False)


def _single(d: Path) -> list[float]:
    m = metrics_of(d)
    assert m["status"] == "completed" and m["config"]["strategy"]["name"] == "single", m.get("error")
    return m["loss"]["per_step"]


@pytest.mark.slow
def test_torch_native_matches_single(runs):
    """Every layout of RUNS: each run checked in turn (a failure names its run)."""
    for run_id, (overrides, layout) in RUNS.items():
        _check_torch_native(run_id, overrides, layout, runs[run_id], runs["single"])


def _check_torch_native(run_id: str, overrides: list[str], layout: dict, d: Path, single: Path) -> None:
    m = metrics_of(d)
    assert m["status"] == "completed", (run_id, m.get("error"))
    assert m["config"]["world_size"] == int(next(o for o in overrides if o.startswith("world_size=")).split("=")[1])
    ref, got = _single(single), loss_curve(d)
    assert _max_diff(ref, got) < 1e-5, (run_id, ref, got)
    t = m["throughput"]
    assert t["tokens_per_step"] == t["tokens_per_step_expected"] == 8 * SEQ
    lay = m["layout"]
    assert lay["impl"] == "torch" and lay["token_rule"] == t["token_rule"]
    for k, v in layout.items():
        assert lay[k] == v, (run_id, k, lay[k], v)
    # exactly one rank per data-parallel replica counts tokens and loss
    counted = [r for r in m["ranks"] if r["tokens_per_step"]]
    assert len(counted) == layout["dp"]
    for r in m["ranks"]:  # the implementation's named setup parts reach metrics.json through tp / pp
        parts = set(r["setup_phases_s"])
        fsdp = "strategy=fsdp" in overrides  # FSDP2 builds its optimizer after the first backward
        assert {"device mesh", "bench model"} | (set() if fsdp else {"optimizer"}) <= parts
        assert ("parallelize_module (TP)" in parts) == (layout["tp"] > 1)
        assert ("pipeline schedule" in parts) == (layout["pp"] > 1)
        if "compile=true" in overrides:  # one graph for all TP blocks, built in warm-up, no break
            assert r["compile"]["graphs"] == r["compile"]["graphs_after_warmup"] >= 1, r["compile"]
            assert r["compile"]["graph_breaks"] == 0, r["compile"]
        else:
            assert r["compile"] is None
    assert c10d_threads_left(d) == []  # DTensor's meshes kept the gloo group (and its threads) alive


def test_torch_tp_pp_gradient_clipping_matches_single(runs):
    """optim.grad_clip with TP=2 x PP=2: the global norm sums the TP shards over tp and the stages
    over pp, so the clipped curve equals single's clipped curve (and differs from the unclipped one)."""
    d1, d2 = runs["single_clip"], runs["tp2_pp2_clip"]
    assert metrics_of(d1)["config"]["optim"]["grad_clip"] == metrics_of(d2)["config"]["optim"]["grad_clip"] == 0.1
    assert metrics_of(d1)["status"] == metrics_of(d2)["status"] == "completed"
    assert metrics_of(d2)["layout"]["grad_clip"] == "global norm over tp shards and pp stages"
    assert _max_diff(loss_curve(d1), loss_curve(d2)) < 1e-5, (loss_curve(d1), loss_curve(d2))
    assert _max_diff(loss_curve(d1), _single(runs["single"])) > 1e-4  # clipping took effect


# --------------------------------------------------------------------------- megatron-core on CPU
# (the workers run under tests.conftest.spawn_ranks: a gloo group of 2 ranks made before and released
# after each, whatever happens in it)
MC = dict(name="t", d_model=64, n_heads=4, n_layers=4, d_ff=256, vocab_size=128, seq_len=16, global_batch=2)


def _megatron_cpu_worker(rank: int, world: int) -> None:
    import torch.distributed as dist

    from megatron.core import parallel_state as ps
    from megatron.core.transformer.spec_utils import ModuleSpec

    from bench.models.model import build_model, lm_loss
    from bench.strategies.megatron import model as mm

    assert mm.resolve_spec("auto") == "sdpa"  # no Transformer Engine here
    spec = mm.layer_spec("sdpa")
    assert isinstance(spec, ModuleSpec)
    assert spec.submodules.self_attention.submodules.core_attention is mm.SDPACoreAttention

    bench = build_model(typed(ModelConfig, MC), 0, "cpu")
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, MC["vocab_size"], (2, MC["seq_len"] + 1), generator=g)
    x, y = batch[:, :-1], batch[:, 1:]
    ref = lm_loss(bench(x), y)
    ref.backward()
    bench_grads = grads_as_model(bench)
    pos = torch.arange(MC["seq_len"]).expand(2, -1)

    # TP = 2: loss and every gradient equal bench's (sliced like the weights)
    ps.initialize_model_parallel(tensor_model_parallel_size=2, create_gloo_process_groups=False)
    cfg = mm.transformer_config(typed(ModelConfig, MC), tp=2, precision="fp32", use_cpu_initialization=True)
    (chunk,) = mm.build_chunks(cfg, typed(ModelConfig, MC), "sdpa")
    tp_rank = ps.get_tensor_model_parallel_rank()
    assert mm.load_bench_weights(chunk, bench, MC["n_heads"], tp_rank, 2) == 5 + 12 * MC["n_layers"]
    loss = chunk(x, pos, None, labels=y).mean()
    assert abs(loss.item() - ref.item()) < 1e-5, (loss.item(), ref.item())
    loss.backward()
    for name, p in chunk.named_parameters():
        want = mm.bench_tensor_for(name, chunk, bench_grads, MC["n_heads"], tp_rank, 2)
        assert (p.grad - want).abs().max().item() < 1e-5, name
    ps.destroy_model_parallel()

    # PP = 2 x 2 virtual stages (4 chunks of one layer: rank 0 holds layers 0 and 2): run the
    # chunks in pipeline order by hand; the last one's loss equals bench's
    ps.initialize_model_parallel(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                                 create_gloo_process_groups=False)
    cfg = mm.transformer_config(typed(ModelConfig, MC), pp=2, virtual_pipeline=2, precision="fp32",
                                use_cpu_initialization=True)
    chunks = mm.build_chunks(cfg, typed(ModelConfig, MC), "sdpa")
    assert [[layer.layer_number for layer in c.decoder.layers] for c in chunks] == [[1 + rank], [3 + rank]]
    assert (chunks[0].pre_process, chunks[1].post_process) == (rank == 0, rank == 1)
    for c in chunks:
        mm.load_bench_weights(c, bench, MC["n_heads"], 0, 1)
    out = run_virtual_pipeline_by_hand(chunks, x, pos, y, MC["d_model"], rank)
    if rank == 1:
        assert abs(out - ref.item()) < 1e-5, (out, ref.item())
    ps.destroy_model_parallel()


def test_megatron_gptmodel_on_cpu_matches_bench():
    """bench's Megatron model code (spec with SDPA core attention, TP split of bench's weights,
    PP/virtual-pipeline layer placement) against bench's GPT, on CPU."""
    spawn_ranks(_megatron_cpu_worker, 2)


def _torch_tp_comms_worker(rank: int, world: int) -> None:
    """Record every all-reduce of one forward + backward of bench's GPT under torch-native TP=2."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils._python_dispatch import TorchDispatchMode

    from bench.models.model import build_model, lm_loss
    from bench.parallel.tp import apply_tp

    class AllReduces(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.dtypes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "all_reduce" in func.__name__:
                self.dtypes.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    ref = build_model(typed(ModelConfig, MC), 0, "cpu")
    model = copy.deepcopy(ref)
    apply_tp(model, mesh)
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, MC["vocab_size"], (2, MC["seq_len"] + 1), generator=g)
    x, y = batch[:, :-1], batch[:, 1:]
    counted = {}
    for dtype in (torch.float32, torch.bfloat16):
        mode = AllReduces()
        with mode, torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = lm_loss(model(x), y)
            loss.backward()
        counted[dtype] = mode.dtypes
        if dtype == torch.float32:  # the plan computes the unsharded model's loss
            assert abs(loss.item() - lm_loss(ref(x), y).item()) < 1e-5
    # per block: forward after o_proj and fc_out, backward into the attention and MLP inputs
    for dtype, seen in counted.items():
        assert len(seen) == 4 * MC["n_layers"], (dtype, len(seen))
        assert set(seen) == {dtype}, (dtype, set(seen))


def test_torch_tp_all_reduces_like_megatron():
    """Torch-native TP=2: two all-reduces per block forward and two backward (q/k/v's shared input
    gradient summed before one all-reduce), in bf16 under bf16 autocast (not the LayerNorm's fp32)."""
    spawn_ranks(_torch_tp_comms_worker, 2)


def _local_shard_adamw_worker(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from bench.models.model import build_model, lm_loss
    from bench.parallel.optim import LocalShardAdamW
    from bench.parallel.tp import apply_tp, local_tensor

    model = build_model(typed(ModelConfig, MC), 0, "cpu")
    apply_tp(model, init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)))
    ref = copy.deepcopy(model)  # the same DTensors, stepped by torch AdamW over the DTensors
    assert any(isinstance(q, DTensor) for q in model.parameters())
    opt = LocalShardAdamW(model.parameters(), OptimConfig(lr=1e-2, beta1=0.9, beta2=0.95, weight_decay=0.1),
                          fused=False)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    assert all(lp.data_ptr() == local_tensor(q).data_ptr() for lp, q in zip(opt.local, opt.params))
    x, y = (torch.randint(0, MC["vocab_size"], (2, MC["seq_len"]), generator=torch.Generator().manual_seed(s))
            for s in (1, 2))
    start = [local_tensor(q).detach().clone() for q in model.parameters()]
    for _ in range(3):
        opt.zero_grad()
        ref_opt.zero_grad(set_to_none=True)
        lm_loss(model(x), y).backward()
        lm_loss(ref(x), y).backward()
        opt.step()
        ref_opt.step()
    for q, r, q0 in zip(model.parameters(), ref.parameters(), start):
        assert not torch.equal(local_tensor(q), q0)  # stepped in place
        assert torch.equal(local_tensor(q), local_tensor(r)), (local_tensor(q) - local_tensor(r)).abs().max()
    opt.zero_grad()  # neither reference to the last gradients survives (the local one kept its memory)
    assert all(q.grad is None for q in opt.params) and all(lp.grad is None for lp in opt.local)


def test_local_shard_adamw_steps_the_dtensors_like_adamw():
    """LocalShardAdamW (torch TP / PP, FSDP2) over TP=2 DTensor parameters: three steps leave every
    shard, in place, bit-equal to torch AdamW stepping the DTensors themselves, and zero_grad drops
    both the DTensor gradients and the local views of them."""
    spawn_ranks(_local_shard_adamw_worker, 2)


# --------------------------------------------------------------------------- validation
def cfg(*overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _error(gpus: int, *overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        validate(cfg(*overrides), gpus=gpus)
    return e.value


def test_every_registered_strategy_has_a_runnable_class():
    """The registry (bench/strategies/registry.py) finds each strategy module's spec; every spec's implementation
    builds a concrete Strategy, and its schema's name default is the strategy's name."""
    from bench.strategies.registry import specs
    from bench.strategies.base import Strategy

    found = specs()
    assert {"single", "ddp", "zero", "fsdp", "tp", "pp", "megatron"} <= set(found)
    for name, spec in found.items():
        assert spec.schema().name == name
        impls = ("megatron", "torch") if "impl" in spec.schema.__dataclass_fields__ and name != "zero" else (None,)
        for impl in impls:
            plan = type("P", (), {"strategy": spec.schema(impl=impl) if impl else spec.schema()})()
            make = spec.implementation(plan)
            if isinstance(make, type):
                assert issubclass(make, Strategy) and not make.__abstractmethods__, (name, impl)
            else:  # a torch-native factory: the class over the strategy's data-parallel policy
                made = make(plan, None)
                assert isinstance(made, Strategy) and made.policy is not None, (name, impl)


def test_megatron_without_cuda_names_impl_torch():
    e = _error(0, "strategy=tp", "world_size=2")
    assert e.key == "strategy.impl" and "strategy.impl=torch" in str(e)
    e = _error(0, "strategy=pp", "world_size=2")
    assert "strategy.impl=torch" in str(e)
    e = _error(0, "strategy=megatron", "world_size=2")
    assert e.key == "strategy.impl" and "strategy=ddp" in str(e)
    e = _error(2, "strategy=megatron", "strategy.impl=torch", "world_size=2")
    assert "megatron-core only" in str(e)
    # with GPUs the same configs are valid
    plan = validate(cfg("strategy=tp", "world_size=2"), gpus=2)
    assert (plan.tp, plan.pp, plan.dp_size, plan.device) == (2, 1, 1, "cuda")
    plan = validate(cfg("strategy=megatron", "world_size=2"), gpus=2)
    assert (plan.tp, plan.pp, plan.dp_size, plan.micro_batch_size) == (1, 1, 2, 4)


@pytest.mark.parametrize("overrides,key,text", [
    (["strategy=tp", "world_size=4", "strategy.tp=4", "model.n_heads=2"], "strategy.tp", "model.n_heads"),
    (["strategy=tp", "world_size=2", "model.d_ff=1001"], "strategy.tp", "model.d_ff"),
    (["strategy=tp", "world_size=2", "model.vocab_size=8001"], "strategy.tp", "model.vocab_size"),
    (["strategy=pp", "world_size=2", "model.n_layers=3"], "strategy.pp", "model.n_layers"),
    (["strategy=pp", "world_size=2", "strategy.virtual_pipeline=4"], "strategy.pp", "model.n_layers"),
    (["strategy=pp", "world_size=2", "strategy.microbatches=3"], "strategy.microbatches", "per-data-parallel-rank batch"),
    (["strategy=pp", "world_size=4", "strategy.microbatches=4p"], "strategy.microbatches", "= 8 micro-batches"),
    (["strategy=pp", "world_size=2", "strategy.microbatches=lots"], "strategy.microbatches", '"<k>p"'),
    (["strategy=pp", "world_size=2", "strategy.micro_batch_size=2"], "strategy.micro_batch_size", "conflicts"),
    (["strategy=tp", "world_size=3"], "world_size", "multiple of strategy.tp x strategy.pp"),
    (["strategy=pp", "world_size=2", "strategy.schedule=gpipe"], "strategy.schedule", "impl=torch"),
    (["strategy=pp", "world_size=2", "strategy.schedule=interleaved_1f1b"], "strategy.schedule", "virtual_pipeline"),
    (["strategy=pp", "world_size=2", "strategy.virtual_pipeline=2", "strategy.microbatches=3",
      "model.global_batch=6"], "strategy.microbatches", "multiple of strategy.pp"),
    (["strategy=tp", "world_size=2", "strategy.tp=1", "strategy.virtual_pipeline=2"], "strategy.virtual_pipeline", "pp > 1"),
    (["strategy=pp", "world_size=2", "strategy.sequence_parallel=true"], "strategy.sequence_parallel", "tp > 1"),
    (["strategy=tp", "world_size=2", "strategy.overlap_param_gather=true"], "strategy.overlap_param_gather",
     "use_distributed_optimizer"),
    (["strategy=tp", "world_size=2", "compile=true"], "compile", "compile=false"),
    (["strategy=megatron", "world_size=2", "precision=fp32", "strategy.grad_reduce_in_fp32=false"],
     "strategy.grad_reduce_in_fp32", "precision=bf16"),
    (["strategy=tp", "world_size=2", "strategy.cuda_graph=true", "warmup_steps=2"], "warmup_steps", "> 2"),
    (["strategy=tp", "world_size=2", "strategy.cuda_graph=true", "precision=fp16"], "strategy.cuda_graph", "bf16"),
    (["strategy=megatron", "world_size=2", "strategy.cuda_graph=true", "strategy.use_distributed_optimizer=true",
      "strategy.overlap_param_gather=true"], "strategy.cuda_graph", "overlap_param_gather=false"),
    (["strategy=tp", *TORCH, "world_size=2", "strategy.cuda_graph=true"], "strategy.cuda_graph", "compile=true"),
    # torch's op-level selective checkpointing: not megatron-core's; every block, so no recompute_every
    (["strategy=megatron", "world_size=2", "recompute=op"], "recompute", "recompute=selective"),
    (["strategy=tp", "world_size=2", "recompute=op"], "recompute", "strategy.impl=torch"),
    (["strategy=fsdp", "world_size=2", "recompute=op", "recompute_every=2"], "recompute_every", "recompute=op"),
])
def test_layout_rules_on_a_gpu_machine(overrides, key, text):
    e = _error(8, *overrides)
    assert e.key == key and text in str(e), str(e)


@pytest.mark.parametrize("overrides,key,text", [
    (["strategy=tp", *TORCH, "world_size=2", "strategy.sequence_parallel=true"], "strategy.sequence_parallel", "megatron"),
    (["strategy=tp", *TORCH, "world_size=2", "precision=fp16", "device=cuda"], "precision", "bf16"),
    (["strategy=pp", *TORCH, "world_size=2", "strategy.virtual_pipeline=2", "strategy.microbatches=3",
      "model.global_batch=6"], None, None),
    # megatron-core's own knobs: the torch implementation would run without them, so a value it would not run is refused
    (["strategy=tp", *TORCH, "world_size=2", "strategy.use_distributed_optimizer=true"],
     "strategy.use_distributed_optimizer", "leave it at False, or use strategy.impl=megatron"),
    (["strategy=pp", *TORCH, "world_size=2", "strategy.grad_reduce_in_fp32=false"], "strategy.grad_reduce_in_fp32",
     "megatron-core only"),
    (["strategy=pp", *TORCH, "world_size=2", "strategy.spec=sdpa"], "strategy.spec", "leave it at auto"),
])
def test_torch_impl_rules(overrides, key, text):
    gpus = 2 if "device=cuda" in overrides else 0
    if key is None:  # torch's interleaved schedule accepts 3 micro-batches on 2 ranks (one round)
        assert validate(cfg(*overrides), gpus=gpus).grad_accum == 3
        return
    e = _error(gpus, *overrides)
    assert e.key == key and text in str(e), str(e)


@pytest.mark.parametrize("setting,expected", [("p", (2, 4)), ("4p", (8, 1)), ("2", (2, 4)), ("null", (1, 8))])
def test_microbatches_resolve_into_the_plan(setting, expected):
    # null: one micro-batch, which only GPipe runs on 2 stages (1F1B needs one per stage: refused, test_config.py)
    plan = validate(cfg("strategy=pp", *TORCH, "world_size=2", f"strategy.microbatches={setting}",
                        "strategy.schedule=gpipe"), gpus=0)
    assert (plan.grad_accum, plan.micro_batch_size) == expected


def test_tp_dp_layout_and_micro_batch_size_still_works():
    plan = validate(cfg("strategy=fsdp", "strategy.tp=2", "world_size=4", "strategy.micro_batch_size=2"), gpus=0)
    assert (plan.tp, plan.pp, plan.dp_size, plan.micro_batch_size, plan.grad_accum) == (2, 1, 2, 2, 2)
    plan = validate(cfg("strategy=tp", "world_size=4", "strategy.micro_batch_size=2"), gpus=4)  # megatron
    assert (plan.tp, plan.dp_size, plan.grad_accum) == (2, 2, 2)


def test_torch_tp_with_data_parallel_points_to_fsdp():
    """torch's DDP does not take DTensor parameters: TP x DP with impl=torch is refused, naming FSDP2 x TP."""
    e = _error(0, "strategy=tp", *TORCH, "world_size=4")
    assert e.key == "world_size" and "strategy=fsdp strategy.tp=2" in str(e)


# --------------------------------------------------------------------------- GPU (skipped here)
GPU_FAST = ["device=cuda", "steps=6", "warmup_steps=1", "metrics.measure_matmul_peak=false",
            "run_timeout_s=240", "dist_timeout_s=180"]
FP32 = ["precision=fp32", "tf32=false"]


@pytest.fixture(scope="module")
def single_gpu(tmp_path_factory):
    out = {}
    for prec in ("fp32", "bf16"):
        d = tmp_path_factory.mktemp(f"single_gpu_{prec}")
        p = run_bench(*GPU_FAST, f"precision={prec}", "tf32=false", "strategy=single", run_dir=d)
        assert p.returncode == 0, p.stderr[-3000:]
        out[prec] = d
    return out


GPU2_RUNS = {
    "megatron_tp2": ["strategy=tp", "world_size=2"],
    "megatron_tp2_sp": ["strategy=tp", "world_size=2", "strategy.sequence_parallel=true"],
    "megatron_pp2_m_p": ["strategy=pp", "world_size=2", "strategy.microbatches=p"],
    "megatron_pp2_m_4p": ["strategy=pp", "world_size=2", "strategy.microbatches=4p"],
    "megatron_pp2_interleaved": ["strategy=pp", "world_size=2", "strategy.virtual_pipeline=2", "strategy.microbatches=4"],
    "megatron_dp2": ["strategy=megatron", "world_size=2"],
    "megatron_dp2_distopt": ["strategy=megatron", "world_size=2", "strategy.use_distributed_optimizer=true",
                             "strategy.overlap_param_gather=true"],
    "torch_tp2": ["strategy=tp", *TORCH, "world_size=2"],
    "torch_pp2": ["strategy=pp", *TORCH, "world_size=2"],
    # forward-backward as one CUDA graph (captured at step 2, so 3 warm-up steps)
    "megatron_tp2_graph": ["strategy=tp", "world_size=2", "strategy.cuda_graph=true", "warmup_steps=3"],
    "megatron_pp2_m_4p_graph": ["strategy=pp", "world_size=2", "strategy.microbatches=4p", "strategy.cuda_graph=true",
                                "warmup_steps=3"],
    "megatron_dp2_graph": ["strategy=megatron", "world_size=2", "strategy.cuda_graph=true", "warmup_steps=3"],
}


@pytest.mark.gpu2
@pytest.mark.parametrize("run_id", list(GPU2_RUNS))
def test_gpu2_fp32_matches_single(run_id, single_gpu, bench_run):
    """fp32 without TF32: every layout starts from single's weights and sees the same batches."""
    p, d = bench_run(*GPU_FAST, *FP32, *GPU2_RUNS[run_id], env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert p.returncode == 0, p.stderr[-4000:]
    m = metrics_of(d)
    assert m["throughput"]["tokens_per_step"] == m["throughput"]["tokens_per_step_expected"]
    assert _max_diff(loss_curve(single_gpu["fp32"]), loss_curve(d)) < 2e-3


@pytest.mark.gpu2
def test_gpu2_cuda_graph_run_exits_by_itself(bench_run):
    """After collectives captured in CUDA graphs, 2-rank runs hung at exit on 2 H200s until a
    deadline ended them (results kept, with an exit_warning): the ranks must end on their own."""
    p, d = bench_run(*GPU_FAST, "precision=bf16", "strategy=megatron", "world_size=2", "strategy.cuda_graph=true",
                     "warmup_steps=3", "teardown_timeout_s=20")
    assert p.returncode == 0, p.stderr[-4000:]
    m = metrics_of(d)
    assert m["status"] == "completed"
    assert "exit_warning" not in m, m["exit_warning"]


@pytest.mark.gpu2
@pytest.mark.parametrize("run_id", ["megatron_tp2", "megatron_pp2_m_4p", "megatron_dp2", "torch_tp2", "torch_pp2"])
def test_gpu2_bf16_close_to_single(run_id, single_gpu, bench_run):
    """bf16: Megatron's (bf16 weights, fp32 master) vs single's (autocast): close, not equal."""
    p, d = bench_run(*GPU_FAST, "precision=bf16", *GPU2_RUNS[run_id], env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert p.returncode == 0, p.stderr[-4000:]
    got = loss_curve(d)
    assert _max_diff(loss_curve(single_gpu["bf16"]), got) < 3e-2
    assert abs(got[-1] - math.log(8000)) < 0.3


@pytest.mark.gpu
def test_gpu_megatron_one_gpu_matches_single(single_gpu, bench_run):
    p, d = bench_run(*GPU_FAST, *FP32, "strategy=megatron", "world_size=1")
    assert p.returncode == 0, p.stderr[-4000:]
    m = metrics_of(d)
    assert m["layout"]["pipeline_schedule"] == "forward_backward_no_pipelining"
    assert _max_diff(loss_curve(single_gpu["fp32"]), loss_curve(d)) < 2e-3
    assert list(m["ranks"][0]["setup_phases_s"]) == [  # where Megatron's start-up time goes
        "import megatron.core", "parallel groups", "bench model (initial weights)", "GPTModel build",
        "copy bench weights", "DistributedDataParallel", "optimizer"]
    assert list(m["ranks"][0]["startup_phases_s"]) == ["device_and_process_group"]  # GPU_FAST: no matmul peak


@pytest.mark.gpu
def test_gpu_megatron_cuda_graph_matches_single(single_gpu, bench_run):
    """strategy.cuda_graph replays the captured forward-backward: the same losses as eager."""
    p, d = bench_run(*GPU_FAST, *FP32, "strategy=megatron", "world_size=1", "strategy.cuda_graph=true",
                     "warmup_steps=3")
    assert p.returncode == 0, p.stderr[-4000:]
    m = metrics_of(d)
    assert m["layout"]["cuda_graph"].startswith("forward-backward captured at step 2")
    assert _max_diff(loss_curve(single_gpu["fp32"]), loss_curve(d)) < 2e-3


_CUDA_PROBE = """
import sys, torch
calls = []
def spy(mod, name):
    f = getattr(mod, name)
    setattr(mod, name, lambda *a, **k: (calls.append(name), f(*a, **k))[1])
for n in ("_lazy_init", "is_available", "device_count", "init", "current_device", "get_device_properties"):
    spy(torch.cuda, n)
for n in [n for n in dir(torch._C) if n.startswith("_cuda_")]:
    spy(torch._C, n)
for m in sys.argv[1:]:
    __import__(m)
print(calls)
"""


def test_fork_server_preloads_make_no_cuda_call():
    """The fork server imports these before it forks the ranks (start_method=forkserver); a rank
    forked from a process that has started CUDA cannot use CUDA, so none may touch it at import."""
    from bench.launch.local import _PRELOAD
    from bench.strategies.registry import SWEEP_PRELOAD, get_spec

    modules = [*_PRELOAD, *SWEEP_PRELOAD, *get_spec("megatron").preload(get_spec("megatron").schema(impl="megatron")),
               *get_spec("zero").preload({})]
    assert {"megatron.core.distributed", "torch._dynamo", "torch._inductor.compile_fx", "deepspeed"} <= set(modules)
    assert get_spec("tp").preload(get_spec("tp").schema(impl="torch")) == ()
    # importing deepspeed asks torch.cuda.device_count() (its accelerator's device count), which reads NVML and
    # starts no CUDA where NVML answers: on a GPU host test_gpu_fork_server_sweep_ranks_use_cuda checks its forks
    for mods, allowed in (([m for m in modules if m != "deepspeed"], "[]"), (["deepspeed"], "['device_count']")):
        p = subprocess.run([sys.executable, "-c", _CUDA_PROBE, *mods], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert p.stdout.strip().splitlines()[-1] == allowed, (mods, p.stdout[-2000:])


@pytest.mark.gpu
def test_gpu_fork_server_sweep_ranks_use_cuda(tmp_path):
    """On a GPU image (triton installed) importing megatron.core or TorchInductor calls
    torch.cuda.is_available(); the fork server must still fork ranks that can start CUDA."""
    sweep = tmp_path / "sweep"
    p = run_bench(*GPU_FAST, "start_method=forkserver", "strategy=single,megatron,zero", "world_size=1",
                  run_dir=sweep, multirun=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    runs = sorted(d for d in sweep.iterdir() if (d / "metrics.json").exists())
    got = {metrics_of(d)["config"]["strategy"]["name"]: metrics_of(d) for d in runs}
    assert sorted(got) == ["megatron", "single", "zero"]
    for name, m in got.items():
        assert m["status"] == "completed", (name, m["error"])
        assert "torch._dynamo" in m["ranks"][0]["preloaded_modules"]
    assert "megatron.core.distributed" in got["megatron"]["ranks"][0]["preloaded_modules"]
    assert "deepspeed" in got["zero"]["ranks"][0]["preloaded_modules"]

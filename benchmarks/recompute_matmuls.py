"""Which of a block's matmuls full recompute runs again, counted on the running step (compiled, as a run compiles).

    python benchmarks/recompute_matmuls.py OUT.json [override ...]   # e.g. model=llama3_8b model.n_layers=2

Builds bench's model from the overrides twice, with ``recompute=none`` and ``recompute=full`` (bench/parallel/ac.py,
then bench/parallel/compile.py, as a run applies them; parameters in bf16 as FSDP2's mixed precision computes a
block; torchao float8 under ``precision=fp8``), runs two steps to compile, then one step under torch.profiler with
``record_shapes``, and counts the matmul ops the step dispatched (aten::mm, addmm, _scaled_mm) whose operands have a
forward's shapes, ``[tokens, in] x [in, out]`` for a block Linear ``in -> out`` (a backward's input-gradient matmul
has them too where another Linear runs ``out -> in``; both settings run those once).  Full recompute less none, per
block and Linear, is what the checkpoint ran again.  Why: the prediction times full recompute as the block's forward less its last
matmul (bench/models/model_spec.py ``checkpoint_skipped_flops_per_token``), which tests/test_flops_reference.py checks
eagerly with FlopCounterMode; this counts it in the compiled step that runs on a GPU.
"""
from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from bench.models.model import build_model, model_loss
from bench.parallel.ac import apply_ac
from bench.parallel.compile import apply_compile
from bench.parallel.float8 import apply_float8
from bench.run.config import register_configs, validate

CONF = Path(__file__).resolve().parents[1] / "conf"
MATMULS = ("aten::mm", "aten::addmm", "aten::_scaled_mm")


def plan_for(overrides: list[str], recompute: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["compile=true", "dry_run=true", *overrides, f"recompute={recompute}"])
    return validate(cfg, gpus=torch.cuda.device_count())


def forward_counts(plan, device: str) -> tuple[collections.Counter, dict]:
    """Matmuls of forward shape in one profiled step, by (in, out); and the block Linears by (in, out)."""
    model = build_model(plan.model, 0, device)
    if plan.run.precision in ("bf16", "fp8"):
        model = model.to(torch.bfloat16)
    if plan.run.precision == "fp8":
        apply_float8(model, plan)
    apply_ac(model, plan.layout)
    apply_compile(model, plan.run)
    b, s = plan.strategy.micro_batch_size or 1, plan.model.seq_len
    tokens = b * s
    block = next(iter(model.blocks.values()))
    linears = collections.defaultdict(list)
    for name, m in block.named_modules():
        if isinstance(m, torch.nn.Linear):
            linears[(m.in_features, m.out_features)].append(name.replace("_checkpoint_wrapped_module.", ""))
    if any(tokens in k for k in linears):
        raise SystemExit(f"tokens a micro-batch ({tokens}) equal a Linear's dimension: pick another model.seq_len")
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(0, plan.model.vocab_size, (b, s + 1), generator=gen).to(device)

    def step():
        model_loss(model, x[:, :-1], x[:, 1:]).backward()
        model.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    counts: collections.Counter = collections.Counter()
    for e in prof.events():
        shapes = e.input_shapes
        if e.name in MATMULS and shapes:
            a, w = (shapes[1], shapes[2]) if e.name == "aten::addmm" else (shapes[0], shapes[1])
            if len(a) == 2 and len(w) == 2 and a[0] == tokens and (a[1], w[1]) in linears and a[1] == w[0]:
                counts[(a[1], w[1])] += 1
    return counts, dict(linears)


def main(out: str, overrides: list[str]) -> dict:
    register_configs()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"overrides": overrides, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "rows": []}
    counts = {}
    for mode in ("none", "full"):
        plan = plan_for(overrides, mode)
        counts[mode], linears = forward_counts(plan, device)
        torch._dynamo.reset()
    layers = plan.model.n_layers
    for shape, names in linears.items():
        none, full = counts["none"][shape], counts["full"][shape]
        result["rows"].append({"linears": names, "in": shape[0], "out": shape[1], "per_step_none": none,
                               "per_step_full": full, "rerun_per_block": (full - none) / layers / len(names)})
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['device']}, torch {result['torch']}, {' '.join(overrides)}: matmuls of a forward's shapes a step")
    print(f"{'linears':<32} {'in -> out':>14} {'none':>5} {'full':>5} {'run again, a block and Linear':>30}")
    for r in result["rows"]:
        print(f"{', '.join(r['linears']):<32} {r['in']:>6} -> {r['out']:<6} {r['per_step_none']:>5} "
              f"{r['per_step_full']:>5} {r['rerun_per_block']:>30.2f}")
    return result


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

"""What one compiled transformer block saves for its backward, tensor by tensor, under a run's precision.

    python benchmarks/saved_tensors.py OUT.json [override ...]      # e.g. model=llama3_8b precision=fp8

Builds bench's model from the overrides (one block, the run's precision: torchao float8 under fp8, compiled as a run
compiles it), runs one block's forward on a micro-batch under ``torch.autograd.graph.saved_tensors_hooks`` and
records every tensor its autograd graph keeps: shape, dtype, bytes, and whether it is a parameter.  The bytes per
token of the non-parameter ones are what the memory plan's per-layer activation term (bench/costs/activations.py)
should count.  Why: fp8's plan was 2.5-5% high on one GPU where bf16's is within 0.3%
(results/2026-12-04-h200x1-long-sequence); this names the tensors instead of guessing.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from bench.models.model import build_model
from bench.parallel.float8 import apply_float8
from bench.run.config import register_configs, validate

CONF = Path(__file__).resolve().parents[1] / "conf"


def saved(overrides: list[str]) -> dict:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["model.n_layers=1", "compile=true", "dry_run=true", *overrides])
    plan = validate(cfg, gpus=torch.cuda.device_count())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(plan.model, 0, device)
    half = plan.run.precision in ("bf16", "fp8")
    if half:  # computed in bf16 parameters, as FSDP2's mixed precision runs a block
        model = model.to(torch.bfloat16)
    if plan.run.precision == "fp8":
        apply_float8(model, plan)
    block = next(iter(model.blocks.values()))
    block.compile()
    b, s, d = plan.strategy.micro_batch_size or 1, plan.model.seq_len, plan.model.d_model
    if any(b * s in p.shape for p in block.parameters()):  # an activation [tokens, n] would pass for a weight
        raise SystemExit(f"tokens a micro-batch ({b * s}) equal a weight's dimension: pick another model.seq_len")
    params = {p.data_ptr() for p in block.parameters()}
    weight_shapes = {tuple(p.shape) for p in block.parameters()}
    x = torch.randn(b, s, d, device=device, requires_grad=True, dtype=torch.bfloat16 if half else torch.float32)
    rows = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        rows.append({"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                     "bytes": t.numel() * t.element_size(), "parameter": t.data_ptr() in params,
                     "weight_shaped": tuple(t.shape) in weight_shapes})
        return t

    for _ in range(2):  # the first call compiles; the second is the one recorded
        rows.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = block(x, rope=block.attn.rope(s, x.device))
        y.float().sum().backward()
    tokens = b * s
    acts = [r for r in rows if not r["parameter"] and not r["weight_shaped"] and len(r["shape"]) > 1]
    return {"overrides": overrides, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__, "tokens": tokens, "d_model": d, "d_ff": plan.model.d_ff,
            "activation_bytes_per_token": sum(r["bytes"] for r in acts) / tokens, "tensors": rows}


if __name__ == "__main__":
    out, overrides = sys.argv[1], sys.argv[2:]
    result = saved(overrides)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{' '.join(overrides)}: {result['activation_bytes_per_token']:.0f} B a token "
          f"({result['activation_bytes_per_token'] / result['d_model']:.2f} d) in "
          f"{sum(not r['parameter'] for r in result['tensors'])} tensors")
    for r in result["tensors"]:
        if not r["parameter"] and len(r["shape"]) > 1:
            print(f"  {r['dtype']:>14} {r['shape']}{' (weight-shaped)' if r['weight_shaped'] else ''}")

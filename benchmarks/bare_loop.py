"""A bare training loop of bench's model, outside the harness, to check bench's overhead.

No Hydra, no elastic launch, no metrics component: the same GPT, the same AdamW
(fused on CUDA), bf16 autocast, a warm-up then a synchronized timed window.
bench's tokens/s for the same settings should be within a few percent of this.

    python benchmarks/bare_loop.py --model 300m --batch 16 --steps 30 --warmup 10 [--compile]
    torchrun --nproc-per-node 2 benchmarks/bare_loop.py --model 300m --batch 16   # plain DDP,
        the global batch split over the ranks
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import yaml

from bench.models.model import GPT, lm_loss

CONF = Path(__file__).resolve().parents[1] / "conf" / "model"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="300m")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    a = ap.parse_args()
    m = {k: v for k, v in yaml.safe_load((CONF / f"{a.model}.yaml").read_text()).items() if k != "defaults"}
    b = a.batch or m["global_batch"]
    ws = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    with dev:
        model = GPT(**m)
    fwd_model = model
    if ws > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("nccl")
        fwd_model = DistributedDataParallel(model, device_ids=[dev.index], bucket_cap_mb=a.bucket_cap_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = torch.compile(fwd_model) if a.compile else fwd_model
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    scaler = torch.amp.GradScaler("cuda", enabled=a.dtype == "fp16")
    data = torch.randint(0, m["vocab_size"], (a.steps, b // ws, m["seq_len"] + 1), device=dev)

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=a.dtype != "fp32"):
            loss = lm_loss(fwd(data[i, :, :-1]), data[i, :, 1:])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for i in range(a.warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(a.warmup, a.steps):
        step(i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tps = (a.steps - a.warmup) * b * m["seq_len"] / dt
    out = {"model": a.model, "batch": b, "world_size": ws, "dtype": a.dtype, "compile": a.compile, "tokens_per_s": tps,
           "step_ms": 1e3 * dt / (a.steps - a.warmup), "device": torch.cuda.get_device_name()}
    if rank != 0:
        return
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out))


if __name__ == "__main__":
    main()

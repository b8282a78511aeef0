"""What a strategy holds between training steps, one rank: the device memory allocated at each step's start and
end, its peak, whether a micro-batch's logits outlive their step (a weak reference to each, with what refers to
it), and what a full garbage collection frees after step 3.  Why: DeepSpeed ZeRO with torch.compile started its
steps 2,004 MiB above DDP on one H100, one micro-batch's bf16 logits (results/2026-12-06-h100x1-zero-memory).

    python benchmarks/zero_memory.py OUT.json [override ...]      # 5 steps (2 warm-up) of bench's strategy

On CPU it runs too (a smoke test): the allocator figures read 0.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import weakref

import torch
import torch.distributed as dist

import bench.models.model as model_module
from benchmarks.zero_copies import build

CUDA = torch.cuda.is_available()
MB = 2**20
LOGITS: list = []  # weak references to each micro-batch's logits, as the loss receives them
_lm_loss = model_module.lm_loss


def _tracked_lm_loss(logits, targets):
    LOGITS.append(weakref.ref(logits))
    return _lm_loss(logits, targets)


def _allocated() -> float:
    return torch.cuda.memory_allocated() / MB if CUDA else 0.0


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def _step_record(st, n: int) -> dict:
    """Step n, and what it left behind."""
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    start = _allocated()
    st.step(n)
    _sync()
    alive = [t for t in (r() for r in LOGITS) if t is not None]
    rec = {"step": n, "start_mb": start, "end_mb": _allocated(),
           "peak_mb": torch.cuda.max_memory_allocated() / MB if CUDA else 0.0,
           "logits_alive_after_step": len(alive),
           "referrers": [[type(x).__name__ for x in gc.get_referrers(t)][:6] + [str(tuple(t.shape)), str(t.dtype)]
                         for t in alive]}
    del alive
    if n == 3:
        gc.collect()
        _sync()
        rec["after_gc_mb"] = _allocated()
        rec["logits_alive_after_gc"] = sum(r() is not None for r in LOGITS)
    LOGITS.clear()
    return rec


def main(out: str, overrides: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1")
    model_module.lm_loss = _tracked_lm_loss
    if CUDA:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if CUDA else "gloo", rank=0, world_size=1)
    device = torch.device("cuda", 0) if CUDA else torch.device("cpu")
    run = ["world_size=1", f"device={device.type}", "steps=6", "warmup_steps=2"]
    plan, st, _ = build(overrides + run, 0, 1, device)
    from bench.plan.memory_model import memory_plan

    rows = []
    for n in range(5):
        rows.append(_step_record(st, n))
        print(json.dumps(rows[-1]), flush=True)
    planned = memory_plan(plan)["predicted_peak_allocated_mb"]
    describe = {k: v for k, v in st.describe().items() if k in ("optimizer", "compiled", "precision", "grad_accum")}
    with open(out, "w") as f:
        json.dump({"overrides": overrides, "rows": rows, "plan_peak_mb": planned, "describe": describe}, f, indent=1,
                  default=str)
    print("plan", planned)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

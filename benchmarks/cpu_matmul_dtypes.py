"""A 256 x 256 x 1024 matmul on one CPU thread in fp32, bf16 and fp16, GFLOP/s (the median of 5 after a warm-up),
with torch's CPU dispatch level: where bf16 / fp16 have no instructions they run far slower than fp32
(bench/machine/hardware_rules.py slow_cpu_precision; docs/development.md).

    python benchmarks/cpu_matmul_dtypes.py
"""
from __future__ import annotations

import statistics
import time

import torch


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, dispatch level {torch.backends.cpu.get_cpu_capability()}")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        a, b = torch.randn(256, 256, dtype=dtype), torch.randn(256, 1024, dtype=dtype)
        a @ b
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        print(f"{dtype}: {2 * 256 * 256 * 1024 / statistics.median(times) / 1e9:.3g} GFLOP/s")


if __name__ == "__main__":
    main()

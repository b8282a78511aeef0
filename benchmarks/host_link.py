"""The host link as a step sees it: device-to-host and host-to-device copies on the compute stream, pinned and
pageable, at a few sizes (what offload_activations and optimizer offload move; bench/plan/predict.py
HOST_LINK_GBPS reads it).

    python -m benchmarks.host_link OUT.json
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

SIZES_MIB = (16, 256, 1024, 4096)


def _gbps(nbytes: int, fn, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def measure() -> list[dict]:
    rows = []
    for mib in SIZES_MIB:
        n = mib * 2**20
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        for pinned in (True, False):
            host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
            rows.append({"mib": mib, "pinned": pinned,
                         "d2h_gbps": round(_gbps(n, lambda: host.copy_(dev, non_blocking=pinned)), 2),
                         "h2d_gbps": round(_gbps(n, lambda: dev.copy_(host, non_blocking=pinned)), 2)})
    return rows


if __name__ == "__main__":
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": measure()}
    text = json.dumps(out, indent=1)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)

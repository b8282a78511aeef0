"""GPU kernel time of profiled steps by kind: attention, matmuls, Inductor's Triton kernels, the rest.

    python benchmarks/kernel_kinds.py TRACE [TRACE2]

Each TRACE is a ``trace_rank0.json.gz`` of a run with ``metrics.profile_steps=1``.  Prints each trace's total kernel
time and, per kind, milliseconds and launches; with two traces, the Triton and other kernels whose time grew most
from the first to the second (what a knob such as recompute=full adds besides its matmuls and attention).  Why:
the prediction times attention, matmuls and memory-bound work apart (bench/plan/predict.py); this says what a step
spent on each (results/2026-12-04-h200x1-long-sequence).
"""
from __future__ import annotations

import collections
import gzip
import json
import sys


def kind(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("fmha", "flash", "cudnn", "sdpa")):
        return "attention"
    if "triton" in n and ("scaled_mm" in n or "_mm_" in n):
        return "matmul_triton"  # an Inductor matmul template (fused with its neighbours)
    if any(s in n for s in ("gemm", "xmma", "nvjet", "cutlass")):
        return "matmul"
    return "triton" if "triton" in n else "other"


def kernels(path: str) -> list[dict]:
    return [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("cat") == "kernel"]


def main(paths: list[str]) -> None:
    by_name = {}
    for path in paths:
        ms, launches, names = collections.Counter(), collections.Counter(), collections.Counter()
        for e in kernels(path):
            k = kind(e["name"])
            ms[k] += e["dur"] / 1e3
            launches[k] += 1
            if k in ("triton", "other"):
                names[e["name"][:80]] += e["dur"] / 1e3
        by_name[path] = names
        parts = ", ".join(f"{k} {ms[k]:.1f} ms / {launches[k]}" for k in sorted(ms))
        print(f"{path}: total {sum(ms.values()):.1f} ms; {parts}")
    if len(paths) == 2:
        a, b = by_name[paths[0]], by_name[paths[1]]
        grown = collections.Counter({k: b.get(k, 0.0) - a.get(k, 0.0) for k in set(a) | set(b)})
        for name, d in grown.most_common(8):
            print(f"  {d:+7.2f} ms  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])

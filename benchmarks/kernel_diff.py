"""Per-layer GPU kernel time from two profiled runs that differ only in depth.

    python benchmarks/kernel_diff.py SHALLOW_TRACE DEEP_TRACE LAYERS [--top N] [--json OUT]

Each trace is a run's ``trace_rank0.json.gz`` (``metrics.profile_steps=1``: one profiled step).  Kernels are summed
by name (Inductor's ``triton_<kind>_fused_...`` kernels by their kind), and the shallow run's time is taken from the
deep run's and divided by the layers between them: what one more transformer block costs, with the embedding, head,
loss and the step's fixed work cancelled out.  Printed: ms and launches per layer, largest first.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import re


def kernel_ms(path: str) -> tuple[collections.Counter, collections.Counter]:
    """{kernel name: ms}, {kernel name: launches} of one trace's device events."""
    trace = json.load(gzip.open(path))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ms, n = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        name = re.sub(r"_\d+$", "", e["name"])
        if name.startswith("triton_"):
            name = "triton " + name.split("_")[1] + " (Inductor)"
        ms[name[:200]] += e["dur"] / 1000.0
        n[name[:200]] += 1
    return ms, n


def per_layer(shallow: str, deep: str, layers: int) -> list[dict]:
    (a, na), (b, nb) = kernel_ms(shallow), kernel_ms(deep)
    rows = [{"kernel": k, "ms_per_layer": (b[k] - a.get(k, 0.0)) / layers,
             "launches_per_layer": (nb[k] - na.get(k, 0)) / layers} for k in b]
    return sorted(rows, key=lambda r: -r["ms_per_layer"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shallow"), ap.add_argument("deep"), ap.add_argument("layers", type=int)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args()
    rows = per_layer(args.shallow, args.deep, args.layers)
    print(f"{sum(r['ms_per_layer'] for r in rows):.2f} kernel ms per layer")
    for r in rows[:args.top]:
        print(f"{r['ms_per_layer']:8.3f} ms {r['launches_per_layer']:6.1f} launches  {r['kernel']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

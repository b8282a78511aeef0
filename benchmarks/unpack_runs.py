"""Turn a collected results JSON (benchmarks/collect.py --out; each results folder keeps its
runs as ``results/<folder>/runs.json``) back into run folders, one metrics.json each, so
multirun_analysis can aggregate recorded GPU results.

    python benchmarks/unpack_runs.py results/*/runs.json --out /tmp/gpu_runs
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    n = 0
    for f in a.files:
        tag = Path(f).parent.name
        for m in json.loads(Path(f).read_text()):
            d = Path(a.out) / tag / f"{n:03d}"
            d.mkdir(parents=True, exist_ok=True)
            m.pop("run_dir", None)
            (d / "metrics.json").write_text(json.dumps(m))
            n += 1
    print(f"{n} runs under {a.out}")


if __name__ == "__main__":
    main()

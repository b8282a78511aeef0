"""How much one probe's link figure moves a slow-link prediction: each recorded run of a link regime re-predicted with
every probe profile its regime's runs were planned with (the shipped calibration, the run's own host factor left
at 1), as predicted / measured tokens/s - 1; then per profile the median |error|.

    python benchmarks/probe_swap.py sockets results/
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from bench.plan.predict import combine, load_calibration, terms
from bench.run.recorded import load_runs, probe_of, result_folders


def main(regime: str, dirs: list[str]) -> None:
    runs, _ = load_runs(result_folders([Path(d) for d in dirs]))
    runs = [r for r in runs if r["regime"] == regime]
    profiles = {}  # (host, date, GB/s) -> the hardware of the first run planned with it
    for r in runs:
        profiles.setdefault(probe_of(r["hardware"]), r["hardware"])
    profiles.pop(None, None)  # runs planned with a preset
    k = load_calibration()["constants"]
    names = [f"{date[:16]} {gbps:g} GB/s" for _, date, gbps in profiles]
    print("| run | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
    errors: list[list[float]] = [[] for _ in profiles]
    for r in runs:
        p, row = r["plan"], []
        for i, hw in enumerate(profiles.values()):
            t = terms(p, hw)
            e = r["step"] / float(combine(t, k)["step_time_s"]) - 1  # tokens/s: predicted / measured - 1
            errors[i].append(abs(e))
            mark = "**" if probe_of(r["hardware"]) == list(profiles)[i] else ""
            row.append(f"{mark}{100 * e:+.0f}%{mark}")
        lay = p.layout
        print(f"| {r['folder']}: {p.model.name} {p.strategy.name} ws={p.world_size} tp={lay.tp} pp={lay.pp} | "
              + " | ".join(row) + " |")
    print("| median \\|error\\| | " + " | ".join(f"{100 * statistics.median(e):.1f}%" for e in errors) + " |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or ["results"])

"""Summary statistics of per-step times (every step time is kept as well)."""
from __future__ import annotations

import statistics


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def step_time_stats(times: list[float]) -> dict:
    return {
        "median": statistics.median(times),
        "mean": statistics.fmean(times),
        "p10": percentile(times, 10),
        "p90": percentile(times, 90),
        "min": min(times),
        "max": max(times),
        "n": len(times),
    }

"""Summary statistics of per-step times (every step time is kept as well), and the timer of the
named start-up phases."""
from __future__ import annotations

import contextlib
import statistics
import time


@contextlib.contextmanager
def phase(into: dict, name: str):
    """Record the wall seconds of the block as ``into[name]`` (rounded to ms; no device sync)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[name] = round(time.perf_counter() - t0, 3)


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

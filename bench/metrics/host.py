"""The host's CPU use over the timed window beside the rank's own: what tells a run that shared its host with
other work (a busy host slows host-bound steps, and every CPU step) from one that had the host to itself.

Linux only (``/proc/stat``); elsewhere the host's numbers are None.  Each rank records its own process's CPU
(all its threads) and the whole host's; the analysis subtracts the run's ranks on a node from that node's busy
CPUs (multirun_analysis/trust.py)."""
from __future__ import annotations

import os
import time
from typing import Optional


def host_cpu_ticks() -> Optional[tuple[int, int]]:
    """(busy, total) clock ticks of every CPU of the host since boot; None without /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(v) < 5:
        return None
    busy = v[0] + v[1] + v[2] + sum(v[5:8])  # user, nice, system, irq, softirq, steal (guest is inside user)
    return busy, busy + v[3] + v[4]  # + idle, iowait


class HostCpu:
    """start() / stop() around a window; summary(): the host's busy CPUs and this process's CPUs, averaged over it."""

    def __init__(self):
        self._t = self._p = self._ticks = None
        self.host_busy_cpus: Optional[float] = None
        self.process_cpus: Optional[float] = None

    def start(self) -> None:
        self._t, self._p, self._ticks = time.perf_counter(), time.process_time(), host_cpu_ticks()

    def stop(self) -> None:
        if self._t is None:
            return
        wall = time.perf_counter() - self._t
        if wall <= 0:
            return
        self.process_cpus = (time.process_time() - self._p) / wall
        end = host_cpu_ticks()
        if self._ticks is not None and end is not None and end[1] > self._ticks[1]:
            self.host_busy_cpus = (end[0] - self._ticks[0]) / (end[1] - self._ticks[1]) * (os.cpu_count() or 1)

    def summary(self) -> dict:
        r = lambda x: None if x is None else round(x, 3)  # noqa: E731
        return {"host_cpus": os.cpu_count(), "host_busy_cpus": r(self.host_busy_cpus),
                "process_cpus": r(self.process_cpus)}

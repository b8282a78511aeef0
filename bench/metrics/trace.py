"""Per-rank time breakdown of the profiled steps, read from each rank's Chrome/Perfetto trace.

With ``metrics.profile_steps=k`` every rank runs its last k steps again under torch.profiler
after the timed window (bench/metrics/profile.py), each step inside a ``ProfilerStep#<n>``
annotation (``n``: the step's global number), and exports the trace, gzipped, into the run
folder as ``trace_rank{r}.json.gz`` (open it in Perfetto or chrome://tracing).  This module
reads such a trace back and splits the profiled window into four parts, in ms per step
(``profile[r].breakdown_ms_per_step`` in metrics.json):

* ``wall``: the window = first ``ProfilerStep#`` start -> the later of the last
  ``ProfilerStep#`` end and the last GPU kernel end (kernels run behind the host), / k;
* ``compute``: the union of the compute intervals (below) in the window;
* ``communication``: the union of the communication intervals in the window;
* ``overlapped``: the time that is in both (communication hidden behind compute);
* ``idle``: the window minus the union of compute and communication,

so ``compute + communication - overlapped + idle = wall`` (exactly, up to rounding).  A
stacked bar of disjoint parts is compute - overlapped, overlapped, communication - overlapped
(exposed communication) and idle.

Which intervals: the same reader for both kinds of trace, only the event selection differs
(:func:`intervals`).

* GPU traces (events of ``cat`` ``kernel``, ``gpu_memcpy``, ``gpu_memset``): communication =
  NCCL kernels (name starting ``nccl``), compute = every other kernel, copy and memset, over
  all streams of the rank's device.  Host operators are not counted: on GPU, time without
  any kernel is idle (the device waits for the host).
* CPU traces (no device events; gloo): there are no kernels, so the rank's host threads are
  read.  Communication = the union over all threads of the collective calls: ``c10d::*`` /
  ``_c10d_functional::*`` operators (on the training thread: the enqueue of an asynchronous
  collective, or a blocking call or wait), ``gloo:*`` / ``nccl:*`` annotations (the
  collective itself, on the process group's worker thread) and ``record_param_comms``.
  Compute = for each thread, the union of the intervals in which it runs an operator
  (``cpu_op``) or an annotated region (``user_annotation``, e.g. ``Optimizer.step``,
  ``DistributedDataParallel.forward``) that is not communication and not ``ProfilerStep#``,
  minus the time that same thread spends inside a communication call; then the union over
  threads.  Idle is host time outside any operator (Python between operators, waits that
  are not an operator).  So on CPU an asynchronous all-reduce on gloo's thread while the
  training thread runs backward operators counts as overlapped.

Holistic Trace Analysis: HolisticTraceAnalysis 0.5.0 does not read bench's CPU (gloo) traces:
on a torch 2.13 CPU trace ``TraceAnalysis.get_temporal_breakdown`` raises IndexError (it
takes the span of the GPU kernels, and there are none) and ``get_comm_comp_overlap``
returns NaN; it is built for GPU kernels (``stream`` >= 0, NCCL kernels by name) and pulls in
JupyterLab.  So this module is bench's own reader of the same events, HTA's definitions on
GPU (union of kernel intervals, NCCL kernels are communication); tests/test_trace.py checks on
a synthetic GPU trace that compute, communication overlap and idle equal HTA's when HTA is
installed.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Iterable, Optional, Union

Interval = tuple[float, float]

STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cpu_op", "user_annotation")
# host-side names of collectives (torch 2.x c10d ops, their profiler annotations, the comms record)
COMM_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::", "gloo:", "nccl:", "record_param_comms")
PARTS = ("compute", "communication", "overlapped", "idle")


# ------------------------------------------------------------------------------ interval algebra
def union(xs: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly the given ones."""
    out: list[list[float]] = []
    for a, b in sorted(x for x in xs if x[1] > x[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(xs: Iterable[Interval]) -> float:
    return sum(b - a for a, b in xs)


def intersect(xs: list[Interval], ys: list[Interval]) -> list[Interval]:
    """Intersection of two disjoint sorted interval lists (as union() returns)."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(xs: list[Interval], ys: list[Interval]) -> list[Interval]:
    """xs minus ys (both disjoint and sorted)."""
    out = []
    for a, b in xs:
        cur = a
        for c, d in ys:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
            if cur >= b:
                break
        if cur < b:
            out.append((cur, b))
    return out


def clip(xs: list[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in xs if min(b, hi) > max(a, lo)]


# ------------------------------------------------------------------------------ the trace
def load(path: Union[str, Path]) -> dict:
    """A Chrome trace (``.json`` or ``.json.gz``) as a dict with ``traceEvents``."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        t = json.load(f)
    return {"traceEvents": t} if isinstance(t, list) else t


def _complete(events: Iterable[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur"), (int, float))]


def is_comm_kernel(name: str) -> bool:
    return name.lower().startswith("nccl")


def is_comm_op(name: str) -> bool:
    return name.startswith(COMM_PREFIXES)


def intervals(trace: dict) -> dict:
    """The profiled window and the compute / communication intervals of one rank's trace
    (microseconds, the trace's clock); see the module docstring for the selection."""
    events = _complete(trace.get("traceEvents") or [])
    span = lambda e: (float(e["ts"]), float(e["ts"]) + float(e["dur"]))  # noqa: E731
    steps = [e for e in events if e.get("cat") in HOST_CATS and STEP_RE.match(str(e.get("name", "")))]
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    if device:
        source = "gpu_kernels"
        comm = [span(e) for e in device if e.get("cat") == "kernel" and is_comm_kernel(str(e.get("name", "")))]
        compute = [span(e) for e in device if not (e.get("cat") == "kernel" and is_comm_kernel(str(e.get("name", ""))))]
        compute_u = union(compute)
    else:
        source = "cpu_ops"
        host = [e for e in events if e.get("cat") in HOST_CATS and not STEP_RE.match(str(e.get("name", "")))]
        comm = [span(e) for e in host if is_comm_op(str(e.get("name", "")))]
        by_thread: dict = {}
        for e in host:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
        compute_u = []
        for evs in by_thread.values():
            busy = union(span(e) for e in evs if not is_comm_op(str(e.get("name", ""))))
            in_comm = union(span(e) for e in evs if is_comm_op(str(e.get("name", ""))))
            compute_u += subtract(busy, in_comm)
        compute_u = union(compute_u)
    comm_u = union(comm)
    if steps:
        lo = min(span(e)[0] for e in steps)
        hi = max(span(e)[1] for e in steps)
        if device:
            hi = max(hi, max(span(e)[1] for e in device))
        n = len({STEP_RE.match(str(e["name"])).group(1) for e in steps})
    else:  # a trace without step annotations: everything it holds is one step
        spans = [span(e) for e in events if e.get("cat") in HOST_CATS + DEVICE_CATS]
        lo, hi = (min(a for a, _ in spans), max(b for _, b in spans)) if spans else (0.0, 0.0)
        n = 1
    return {"source": source, "steps": n, "window": (lo, hi),
            "compute": clip(compute_u, lo, hi), "communication": clip(comm_u, lo, hi)}


def breakdown(trace: Union[dict, str, Path], n_steps: Optional[int] = None, ndigits: int = 3) -> dict:
    """compute / communication / overlapped / idle (and wall) in ms per step of one rank's trace."""
    t = trace if isinstance(trace, dict) else load(trace)
    iv = intervals(t)
    n = n_steps or iv["steps"] or 1
    lo, hi = iv["window"]
    comp, comm = iv["compute"], iv["communication"]
    both = intersect(comp, comm)
    busy = union(comp + comm)
    per = 1e-3 / n  # us in the window -> ms per step
    parts = {"compute": length(comp), "communication": length(comm), "overlapped": length(both),
             "idle": max(0.0, (hi - lo) - length(busy)), "wall": hi - lo}
    return {"source": iv["source"], "steps": n,
            "ms_per_step": {k: round(v * per, ndigits) for k, v in parts.items()}}


def stacked(b: dict) -> dict:
    """The four disjoint parts of a breakdown_ms_per_step (they add up to its wall)."""
    return {"compute only": b["compute"] - b["overlapped"], "overlapped": b["overlapped"],
            "exposed communication": b["communication"] - b["overlapped"], "idle": b["idle"]}

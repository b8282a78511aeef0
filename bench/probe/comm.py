"""What the ranks measure together: each collective's bus bandwidth against message size, in one group.

Bus bandwidth is nccl-tests' (doc/PERFORMANCE.md): algbw = size / time, where size is the buffer of an
all-reduce, the whole gathered output of an all-gather, the whole input of a reduce-scatter and the
buffer each rank sends in a send/recv ring; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for
all-gather and reduce-scatter, x 1 for send/recv: a number comparable to the link's speed, whatever n.
A sample is the slowest rank's time of a loop of calls between barriers; the curve keeps the median.

Smaller groups of one node (``subgroup_curves``): the all-reduce over groups of 2, 4, ... of its ranks, one group
alone (a run on fewer GPUs than the node has) and every group at once (tensor or data parallelism of that size over
the whole node).  On a link the ranks share (host memory, the network stack) a group's bandwidth depends on how many
ranks move data at once, which a curve over the whole node does not show.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from bench.probe.measure import MIB, Sizes, sync

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw for n ranks (module docstring)."""
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "send_recv": 1.0}[collective]


def _gather():  # torch >= 2.13 names them *_single; older: *_tensor / *_into_tensor
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _scatter():
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _call(collective: str, nbytes: int, ranks: list[int], group, device, dtype) -> tuple[Callable[[], None], int]:
    """(one call of the collective over ``ranks`` (global ranks of ``group``) on a message of about ``nbytes``,
    the message's exact bytes: n equal parts)."""
    n, elem = len(ranks), torch.tensor([], dtype=dtype).element_size()
    count = max(nbytes // elem // n, 1)
    return _make(collective, count, n, ranks, group, device, dtype), count * n * elem


def _make(collective: str, count: int, n: int, ranks: list[int], group, device, dtype) -> Callable[[], None]:
    if collective == "all_reduce":
        x = torch.ones(count * n, device=device, dtype=dtype)
        return lambda: dist.all_reduce(x, group=group)
    if collective == "all_gather":
        part, whole, fn = torch.ones(count, device=device, dtype=dtype), torch.empty(count * n, device=device,
                                                                                     dtype=dtype), _gather()
        return lambda: fn(whole, part, group=group)
    if collective == "reduce_scatter":
        whole, part, fn = torch.ones(count * n, device=device, dtype=dtype), torch.empty(count, device=device,
                                                                                         dtype=dtype), _scatter()
        return lambda: fn(part, whole, group=group)
    me = ranks.index(dist.get_rank())
    out, inp = torch.ones(count * n, device=device, dtype=dtype), torch.empty(count * n, device=device, dtype=dtype)
    ops = [dist.P2POp(dist.isend, out, ranks[(me + 1) % n], group), dist.P2POp(dist.irecv, inp, ranks[(me - 1) % n],
                                                                               group)]
    return lambda: [w.wait() for w in dist.batch_isend_irecv(ops)]


def _slowest_rank_seconds(call: Callable[[], None], group, device, s: Sizes) -> float:
    """The median over repeats of the slowest rank's seconds per call (all ranks start together: a barrier)."""
    for _ in range(2):
        call()
    samples = []
    for _ in range(s.repeats):
        dist.barrier(group=group)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(s.iters):
            call()
        sync(device)
        samples.append((time.perf_counter() - t0) / s.iters)
    t = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return statistics.median(t.tolist())


def curves(ranks: list[int], group, device: torch.device, s: Sizes, collectives=COLLECTIVES) -> dict:
    """{collective: [{bytes, time_us, algbw_gbps, busbw_gbps}, ...]} over the message sizes, on ``ranks``."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # what gradients travel in
    out = {}
    for name in collectives:
        rows = []
        for mib in s.message_mib:
            call, nbytes = _call(name, int(mib * MIB), ranks, group, device, dtype)
            t = _slowest_rank_seconds(call, group, device, s)
            algbw = nbytes / t / 1e9
            rows.append({"bytes": nbytes, "time_us": round(t * 1e6, 2), "algbw_gbps": round(algbw, 3),
                         "busbw_gbps": round(algbw * bus_factor(name, len(ranks)), 3)})
        out[name] = rows
    return out


def subgroup_sizes(n: int) -> list[int]:
    """The smaller group sizes measured on a node of ``n`` ranks: 2, 4, ... below n that divide it."""
    return [g for g in (2 ** k for k in range(1, n.bit_length())) if g < n and n % g == 0]


def subgroup_curves(node: list[int], node_group, groups: dict, device: torch.device, s: Sizes) -> dict:
    """{"<g>": {"alone": rows, "together": rows}}: the all-reduce curve (``curves``' rows) of the node's first group
    of g ranks with its other ranks idle, then of the slowest group while every group of g measures at once (module
    docstring).  ``groups``: (g, first rank) -> the process group of ``node``'s g ranks from that one, made by every
    rank (bench/probe/ranks.py); every rank of the node calls this, the idle ones wait at the node's barrier."""
    me = node.index(dist.get_rank())
    out = {}
    for g in subgroup_sizes(len(node)):
        first = me // g * g
        ranks, group = node[first:first + g], groups[(g, node[first])]
        alone = curves(ranks, group, device, s, ("all_reduce",))["all_reduce"] if first == 0 else None
        dist.barrier(group=node_group)
        together = _slowest(curves(ranks, group, device, s, ("all_reduce",))["all_reduce"], node_group, device)
        dist.barrier(group=node_group)
        out[str(g)] = {"alone": alone, "together": together}
    return out


def _slowest(rows: list[dict], node_group, device: torch.device) -> list[dict]:
    """Each message size's row of the group that took longest, over the node's groups (the step waits for it)."""
    t = torch.tensor([r["time_us"] for r in rows], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=node_group)
    return [{**r, "time_us": round(slow, 2), "algbw_gbps": round(r["algbw_gbps"] * r["time_us"] / slow, 3),
             "busbw_gbps": round(r["busbw_gbps"] * r["time_us"] / slow, 3)} for r, slow in zip(rows, t.tolist())]


def link_gbps(curve: dict) -> float:
    """The link's bandwidth from a curve set: all-reduce bus bandwidth at the largest message (bandwidth-bound,
    what a gradient all-reduce sees)."""
    return curve["all_reduce"][-1]["busbw_gbps"]

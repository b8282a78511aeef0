"""What is alive at a step's allocated peak, and where it was allocated: the CUDA caching allocator's own history
(``torch.cuda.memory._record_memory_history``) over the profiled steps (``metrics.profile_steps``), replayed to its
peak.  The memory plan's terms are checked against this where a measured peak and the plan disagree (fp8, say):
each group names the allocating line of bench's code (else the innermost Python frame) and its MiB at the peak.
Allocations made before the profiled steps (the model states, the last step's gradients) have no history:
``before_mb``, of which ``before_freed_mb`` were freed by the peak."""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

MB = 2**20
TOP = 20  # groups kept in the record
MAX_ENTRIES = 2_000_000  # the allocator's history ring: enough for a few steps of an 8B model


def start(device) -> Optional[float]:
    """Begin recording (CUDA only); returns the bytes allocated before it (None off CUDA)."""
    if getattr(device, "type", "cpu") != "cuda":
        return None
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=MAX_ENTRIES)
    return float(torch.cuda.memory_allocated(device))


def stop(device, before: Optional[float]) -> Optional[dict]:
    """Stop recording and return the peak's breakdown (None off CUDA or when the history cannot be read)."""
    if before is None:
        return None
    import torch

    try:
        snap = torch.cuda.memory._snapshot(device)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    traces = snap.get("device_traces") or []
    idx = getattr(device, "index", None) or 0
    return at_peak(traces[idx] if idx < len(traces) else [], before)


def _where(frames: list[dict]) -> str:
    """The allocating line: the innermost frame in bench's code, else the innermost Python frame."""
    if not frames:
        return "no Python frame (autograd's backward, a compiled graph's buffers)"
    mine = [f for f in frames if "/bench/" in f.get("filename", "")]
    f = (mine or frames)[0]
    name = f.get("filename", "?").rsplit("/", 2)
    return f"{'/'.join(name[-2:])}:{f.get('line', '?')} {f.get('name', '?')}"


def at_peak(events: list[dict], before: float) -> dict:
    """Replay alloc / free events to the largest sum of live blocks (blocks from before the history freed on the way
    lower it); group those alive then by where."""
    live: dict[int, tuple[int, str]] = {}
    now = peak = freed = freed_at_peak = 0
    at: dict[int, tuple[int, str]] = {}
    for e in events:
        action, addr, size = e.get("action"), e.get("addr"), e.get("size", 0)
        if action == "alloc":
            live[addr] = (size, _where(e.get("frames") or []))
            now += size
            if now > peak:
                peak, at, freed_at_peak = now, dict(live), freed
        elif action == "free_completed":  # a block from before the history (last step's gradients) counts too
            if addr in live:
                now -= live.pop(addr)[0]
            else:
                now, freed = now - size, freed + size
    groups: dict[str, float] = defaultdict(float)
    for size, where in at.values():
        groups[where] += size
    top = sorted(groups.items(), key=lambda kv: -kv[1])[:TOP]
    return {"before_mb": round(before / MB, 1), "before_freed_mb": round(freed_at_peak / MB, 1),
            "step_peak_mb": round(peak / MB, 1),
            "peak_allocated_mb": round((before + peak) / MB, 1),
            "by_where_mb": {k: round(v / MB, 1) for k, v in top}, "events": len(events)}

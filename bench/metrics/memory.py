"""What the caching allocator saw in a run, and the device memory outside it (issue 43's edge runs: near the
limit the allocator retries and flushes, and graph pools and communicators live outside it; neither showed in the
peak alone).  CPU runs record null with the reason; nothing is estimated here."""
from __future__ import annotations

import os
from typing import Optional

MB = 2**20


def allocator_record(device, nvml_used_peak_mb: Optional[float] = None) -> dict:
    """This rank's torch.cuda.memory_stats() at the end of the run: the reserved peak, cudaMalloc retries, OOMs,
    the inactive split bytes (fragmentation) at their peak, the pinned host allocator's peak, and NVML's used peak
    minus the reserved peak (device memory outside PyTorch's allocator: context, NCCL, graphs' own); ``conf``:
    PYTORCH_CUDA_ALLOC_CONF as this rank ran (config ``allocator``, bench/machine/allocator.py)."""
    if getattr(device, "type", "cpu") != "cuda":
        return {"reason": "not a CUDA device: no caching allocator"}
    import torch

    s = torch.cuda.memory_stats(device)
    reserved = s.get("reserved_bytes.all.peak", 0) / MB
    host = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    return {"reserved_peak_mb": reserved, "num_alloc_retries": s.get("num_alloc_retries", 0),
            "num_ooms": s.get("num_ooms", 0),
            "inactive_split_peak_mb": s.get("inactive_split_bytes.all.peak", 0) / MB,
            "outside_allocator_mb": None if nvml_used_peak_mb is None else nvml_used_peak_mb - reserved,
            # pinned host memory (offload_activations, optimizer offload): the host allocator's blocks, rounded
            "host_pinned_peak_mb": host["allocated_bytes.peak"] / MB if "allocated_bytes.peak" in host else None,
            "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}


def summarize(ranks: list[dict], own: Optional[dict] = None) -> dict:
    """metrics.json's memory.allocator: the ranks' records (the largest of each field), else ``own`` (rank 0's,
    taken where metrics.json is assembled) with its scope said; null fields with the reason on CPU."""
    recs = [r["allocator"] for r in ranks if isinstance(r.get("allocator"), dict) and "reason" not in r["allocator"]]
    scope = "all ranks"
    if not recs and own is not None and "reason" not in own:
        recs, scope = [own], "rank 0 only (the ranks' records have no allocator field)"
    keys = ("reserved_peak_mb", "num_alloc_retries", "num_ooms", "inactive_split_peak_mb", "outside_allocator_mb",
            "host_pinned_peak_mb")
    if not recs:
        reason = (own or {}).get("reason") or next((r["allocator"]["reason"] for r in ranks
                                                     if isinstance(r.get("allocator"), dict)), "not recorded")
        return {**{k: None for k in keys}, "scope": None, "reason": reason}
    out = {k: max((x[k] for x in recs if x.get(k) is not None), default=None) for k in keys}
    confs = list(dict.fromkeys(x.get("conf") for x in recs))
    return {**out, "conf": confs[0] if len(confs) == 1 else confs, "scope": scope, "reason": None}

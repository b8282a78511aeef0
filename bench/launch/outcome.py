"""How a run's ranks ended, as the run's status and its root cause (both ways of launching share it)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Outcome:
    status: str  # completed | failed | oom | timeout | interrupted
    error: Optional[dict] = None
    failures: list[dict] = field(default_factory=list)  # failure_rank*.json of the run


def from_failures(failures: list[dict]) -> Outcome:
    """The outcome the ranks' own records give: the earliest is the root cause."""
    root = failures[0]
    status = "interrupted" if root.get("type") == "KeyboardInterrupt" else ("oom" if root.get("oom") else "failed")
    return Outcome(status, {k: root.get(k) for k in ("rank", "type", "message", "traceback")}, failures)


def timeout_error(timeout_s) -> dict:
    return {"rank": None, "type": "Timeout", "message": f"run exceeded run_timeout_s={timeout_s}; "
            "all its processes were terminated", "traceback": None}


# NCCL's own allocations on a full device: "ncclUnhandledCudaError: ... Last error: Failed to CUDA calloc async 4
# bytes" (a barrier after the warm-up of a one-rank run at the limit, 1 x H100, results/2026-12-06-h100x1-tight-edge)
NCCL_ALLOC_FAILED = re.compile(r"failed to cuda (c|m)alloc")


def oom_in_chain(exc: BaseException) -> BaseException | None:
    """The out-of-memory error that ``exc`` is or was raised from or while handling: a CUDA graph capture that ran
    out of memory raises torch.AcceleratorError from capture_end instead, and NCCL's failed device allocation a
    DistBackendError (NCCL_ALLOC_FAILED)."""
    import torch  # a rank's failure: torch is loaded

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        text = str(exc).lower()
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or NCCL_ALLOC_FAILED.search(text):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None

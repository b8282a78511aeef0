"""How a run's ranks ended, as the run's status and its root cause (both ways of launching share it)."""
from __future__ import annotations

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

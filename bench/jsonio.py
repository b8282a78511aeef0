"""Atomic JSON writing: a reader never sees a half-written result."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Optional


def _clean(x: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_clean(data), f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as f:
        return json.load(f)


def read_json_dict(path: str | os.PathLike) -> Optional[dict]:
    """A JSON object from path, or None when it is missing, unreadable, partial or not an object
    (a run folder can be left in any state by a killed run)."""
    try:
        d = read_json(path)
    except Exception:
        return None
    return d if isinstance(d, dict) else None

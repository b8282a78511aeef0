"""The CUDA caching allocator a run uses (``allocator=``), set in each rank before CUDA starts.

``expandable_segments``: PyTorch maps more physical memory into one growing virtual segment instead of cudaMalloc-ing
fixed blocks (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, what torchtitan's launcher exports).  Blocks of
different sizes stop stranding free memory between them, so a run near the device's limit neither fails with
memory reserved but unallocated nor slows in the allocator's free-and-retry path.  ``default``: PyTorch's allocator
as it comes.  The value in effect is recorded in each rank's record (``ranks[].cuda_alloc_conf``).
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from bench.spec.schema import ConfigError

VAR = "PYTORCH_CUDA_ALLOC_CONF"
SETTINGS = {"default": None, "expandable_segments": "expandable_segments:True"}


def _expandable(conf: Optional[str]) -> bool:
    return any(p.strip().replace(" ", "") == "expandable_segments:True" for p in (conf or "").split(","))


def check(name: str, device: str, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse a setting the run could not honour, before launch: a CUDA allocator on CPU, or ``default`` while the
    inherited environment already turns expandable segments on (the record would say what did not run)."""
    if name != "default" and device != "cuda":
        raise ConfigError("allocator", name, "sets the CUDA caching allocator; this run is on CPU: use allocator=default")
    if name == "default" and device == "cuda" and _expandable(environ.get(VAR)):
        raise ConfigError("allocator", name, f"the environment has {VAR}={environ[VAR]}, which turns expandable "
                          "segments on: set allocator=expandable_segments to say so, or unset the variable")


def rank_env(name: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variable a rank sets before CUDA starts: the setting added to what the environment already asks for."""
    want = SETTINGS[name]
    if want is None or _expandable(environ.get(VAR)):
        return {}
    have = environ.get(VAR)
    return {VAR: f"{have},{want}" if have else want}

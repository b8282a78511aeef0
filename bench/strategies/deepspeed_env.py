"""The environment DeepSpeed's JIT-built ops (cpu_adam, fused_adam, ...) need: where they build, and a
CUDA arch list its op builder can parse.  Set before ``import deepspeed`` (bench/strategies/zero.py)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
# One JIT-build cache for DeepSpeed's C++/CUDA ops (cpu_adam, fused_adam, ...) per checkout:
# git-ignored, shared by runs and tests, so each op compiles once per machine.
DEFAULT_TORCH_EXTENSIONS_DIR = REPO / ".torch_extensions"


def ensure_torch_extensions_dir() -> str:
    """TORCH_EXTENSIONS_DIR, defaulting to <repo>/.torch_extensions (an explicit setting wins)."""
    return os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(DEFAULT_TORCH_EXTENSIONS_DIR))


_ARCH_SUFFIX = re.compile(r"(\d+\.\d+)[a-z]+")  # 9.0a, 10.0f (arch-/family-specific targets)


def fix_cuda_arch_list(environ: Optional[dict] = None) -> Optional[dict]:
    """DeepSpeed 0.19.8's op builder parses TORCH_CUDA_ARCH_LIST entries as int.int(+PTX) and
    fails on "9.0a" (ValueError: '0a'); rewrite such entries to the plain arch ("9.0a" -> "9.0").
    Returns {"from", "to"} when the variable was rewritten, else None."""
    env = os.environ if environ is None else environ
    old = env.get("TORCH_CUDA_ARCH_LIST")
    if not old:
        return None
    new = _ARCH_SUFFIX.sub(r"\1", old)
    if new == old:
        return None
    env["TORCH_CUDA_ARCH_LIST"] = new
    return {"from": old, "to": new}

"""Where and with what a number was measured."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional


def _version(pkg: str) -> Optional[str]:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd: Optional[str] = None) -> Optional[str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
        return out.stdout.strip() if out.returncode == 0 else None
    except Exception:
        return None


def versions() -> dict:
    import torch

    nccl = None
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "deepspeed": _version("deepspeed"),
        "megatron_core": _version("megatron-core") or _version("megatron_core"),
        "transformer_engine": _version("transformer_engine") or _version("transformer-engine"),
        "hydra_core": _version("hydra-core"),
        "nvidia_ml_py": _version("nvidia-ml-py"),
        "bench": _version("bench"),
    }


def collect(command: list[str], device_names: list[Optional[str]]) -> dict:
    """Host-level provenance (called on rank 0 of the run)."""
    repo = str(Path(__file__).resolve().parents[2])
    return {
        "command": command,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": __import__("os").cpu_count(),
        "versions": versions(),
        "devices": device_names,
        "nvidia_smi_topo": _run(["nvidia-smi", "topo", "-m"]),
        "git_commit": _run(["git", "rev-parse", "HEAD"], cwd=repo),
        "git_dirty": bool(_run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)),
        "python_executable": sys.executable,
    }

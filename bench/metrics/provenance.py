"""Where and with what a number was measured."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional


def package_version(pkg: str) -> Optional[str]:
    """An installed distribution's version, None where it is not installed."""
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd: Optional[str] = None, env: Optional[dict] = None) -> Optional[str]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd, env=env)
        return out.stdout.strip() if out.returncode == 0 else None
    except Exception:
        return None


# git obeys these over its working directory (set by git hooks, or left by a tool): they would point
# it at another repository
_GIT_LOCATION_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


def _git(args: list[str], cwd: Path) -> Optional[str]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION_VARS}
    return _run(["git", "-C", str(cwd), *args], env=env)


def source_git() -> dict:
    """The git state of bench's own source: the checkout that tracks the ``bench`` package's files,
    whatever the working directory.  git_commit is None (git_commit_reason says why) when bench is
    not in a git checkout: installed into site-packages (even inside some other repository, e.g. a
    virtual environment in a project's folder), or git missing."""
    pkg = Path(__file__).resolve().parents[1]  # the bench package
    top = _git(["rev-parse", "--show-toplevel"], pkg)
    if top is None:
        return {"git_commit": None, "git_dirty": None,
                "git_commit_reason": f"bench's source ({pkg}) is not in a git checkout (or git is unavailable)"}
    if not _git(["ls-files", "--", "__init__.py"], pkg):  # the enclosing repository does not hold bench
        return {"git_commit": None, "git_dirty": None,
                "git_commit_reason": f"bench's source ({pkg}) is not tracked by the git repository at {top}"}
    commit = _git(["rev-parse", "HEAD"], Path(top))
    return {"git_commit": commit,
            "git_dirty": bool(_git(["status", "--porcelain", "--untracked-files=no"], Path(top))),
            "git_commit_reason": None if commit else f"no commit in the git repository at {top}"}


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
        "deepspeed": package_version("deepspeed"),
        "megatron_core": package_version("megatron-core") or package_version("megatron_core"),
        "transformer_engine": package_version("transformer_engine") or package_version("transformer-engine"),
        "hydra_core": package_version("hydra-core"),
        "nvidia_ml_py": package_version("nvidia-ml-py"),
        "bench": package_version("bench"),
    }


def _nccl() -> dict:
    """The link regime, the NCCL variables and the transports NCCL used (bench/machine/link_regime.py)."""
    from bench.machine.link_regime import of_this_run

    try:
        return of_this_run()
    except Exception as e:  # noqa: BLE001  (a record must not fail the run)
        return {"error": f"{type(e).__name__}: {e}"}


def collect(command: list[str], device_names: list[Optional[str]]) -> dict:
    """Host-level provenance (called on rank 0 of the run)."""
    return {
        "command": command,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        "devices": device_names,
        "nvidia_smi_topo": _run(["nvidia-smi", "topo", "-m"]),
        "nccl": _nccl(),
        **source_git(),
        "python_executable": sys.executable,
    }

"""Shared helpers: run bench as a user would (a subprocess of `python -m bench`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Small, fast, exact: fp32 on CPU, a few steps.
CPU_FAST = ["device=cpu", "precision=fp32", "steps=4", "warmup_steps=1"]


def run_bench(*overrides: str, run_dir: Path | None = None, multirun: bool = False,
              timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m bench [--multirun] overrides...` with its output folder under run_dir."""
    args = [sys.executable, "-m", "bench"]
    if multirun:
        args.append("--multirun")
    args += list(overrides)
    if run_dir is not None:
        args.append(f"hydra.{'sweep' if multirun else 'run'}.dir={run_dir}")
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=e)


def metrics_of(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def loss_curve(run_dir: Path) -> list[float]:
    return metrics_of(run_dir)["loss"]["per_step"]


@pytest.fixture(scope="session")
def single_cpu(tmp_path_factory):
    """One `strategy=single` run (CPU_FAST) shared by every loss-equivalence test."""
    d = tmp_path_factory.mktemp("single")
    p = run_bench(*CPU_FAST, "strategy=single", run_dir=d)
    assert p.returncode == 0, p.stderr[-3000:]
    return d


@pytest.fixture
def bench_run(tmp_path):
    """Run one benchmark into a fresh folder; returns (completed_process, run_dir)."""
    counter = iter(range(1000))

    def _run(*overrides: str, **kw):
        d = tmp_path / f"run{next(counter)}"
        p = run_bench(*overrides, run_dir=d, **kw)
        return p, d
    return _run


def pytest_collection_modifyitems(config, items):
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and n < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "gpu2" in item.keywords and n < 2:
            item.add_marker(pytest.mark.skip(reason="needs two CUDA GPUs"))

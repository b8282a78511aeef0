"""The commands that only read bench's descriptions - a dry run, a refused override, the planner - do not import torch
on a machine without an NVIDIA driver: its import was half of such a command's CPU time on the CPU machine (1.9 of
3.8 CPU-seconds).  A run's ranks import it where they build their strategy (bench/strategies/registry.py
``_REGISTER_NOTHING``; each strategy module's ``implementation``).  Checked with ``python -X importtime``, which lists
every module the command imported; each command's own output is checked too, so a command that failed early cannot
pass."""
from __future__ import annotations

import subprocess
import sys

import pytest

from bench.machine.hardware_rules import no_nvidia_driver
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not no_nvidia_driver(), reason="an NVIDIA driver answers here: validation asks torch "
                                                                "how many CUDA devices it sees")

# (command, its exit code, a line its output has)
COMMANDS = {
    "dry_run": (["-m", "bench", "dry_run=true", "model=llama3_8b", "strategy=fsdp", "world_size=8",
                 "hardware=h100_sxm_80gb"], 0, "prediction:"),
    "zero_dry_run": (["-m", "bench", "strategy=zero", "zero_stage=3", "world_size=2", "dry_run=true"], 0,
                     "strategy=zero world_size=2"),
    "refused": (["-m", "bench", "strategy=zero", "zero_stage=5"], 2, "strategy.zero_stage=5: valid: 0, 1, 2, 3"),
    "planner": (["-m", "bench.planner", "model=llama3_1b", "hardware=h100_sxm_80gb", "gpus_per_node=4"], 0,
                "searched"),
}


def _imported(stderr: str) -> set[str]:
    """The modules ``-X importtime`` says were imported."""
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("name", COMMANDS)
def test_command_that_only_reads_descriptions_does_not_import_torch(name, tmp_path):
    args, code, says = COMMANDS[name]
    run_dir = [f"hydra.run.dir={tmp_path / 'run'}"] if args[1] == "bench" else []
    p = subprocess.run([sys.executable, "-X", "importtime", *args, *run_dir], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    out = p.stdout + "\n".join(line for line in p.stderr.splitlines() if not line.startswith("import time:"))
    assert p.returncode == code and says in out, (p.returncode, out[-3000:])
    imported = _imported(p.stderr)
    assert "omegaconf" in imported  # the listing is there
    assert "torch" not in imported, sorted(m for m in imported if m.startswith("torch"))[:20]

"""The commands that only read bench's descriptions - a dry run, a refused override, the planner - do not import torch
on a machine without an NVIDIA driver: its import was most of such a command's time on the CPU machine (a dry run 2.87 s
with it, 0.97 s without: results/2026-12-07-cpu-command-start).  A run's ranks import it where they build their strategy (bench/strategies/registry.py
``_REGISTER_NOTHING``; each strategy module's ``implementation``).  Checked with ``python -X importtime``, which lists
every module the command imported; each command's own output is checked too, so a command that failed early cannot
pass.  The analysis (multirun_analysis) is checked on a dry-run sweep, whose plans it ranks."""
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


def _torch_modules(args: list[str], code: int, says: str) -> list[str]:
    """Run ``python -X importtime <args>`` in the repository; check its exit code and a line of its output; return the
    torch modules it imported."""
    p = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    out = p.stdout + "\n".join(line for line in p.stderr.splitlines() if not line.startswith("import time:"))
    assert p.returncode == code and says in out, (args, p.returncode, out[-3000:])
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "omegaconf" in imported  # the listing is there
    return sorted(m for m in imported if m == "torch" or m.startswith("torch."))


@pytest.mark.parametrize("name", COMMANDS)
def test_command_that_only_reads_descriptions_does_not_import_torch(name, tmp_path):
    args, code, says = COMMANDS[name]
    run_dir = [f"hydra.run.dir={tmp_path / 'run'}"] if args[1] == "bench" else []
    assert _torch_modules([*args, *run_dir], code, says) == []


def test_dry_run_sweep_and_its_analysis_do_not_import_torch(tmp_path):
    """A dry-run sweep (each run planned and predicted, none run) and the analysis that ranks its plans."""
    sweep = tmp_path / "sweep"
    assert _torch_modules(["-m", "bench", "--multirun", "strategy=ddp,fsdp", "world_size=2", "dry_run=true",
                           f"hydra.sweep.dir={sweep}"], 0, "dry run: nothing run") == []
    assert _torch_modules(["-m", "multirun_analysis", str(sweep)], 0, "report.md") == []

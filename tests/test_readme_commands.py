"""Every `python -m bench ...` line of the README's command list composes and validates as typed (on an
8-GPU node: the lines are for GPUs unless they say otherwise), so the front door never shows a command
that fails with `invalid config`."""
from __future__ import annotations

import re
import shlex

import pytest
from hydra import compose, initialize_config_dir

from bench.run.config import register_configs, validate
from tests.conftest import REPO

register_configs()


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("## The commands people run", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.startswith("python -m bench ")
            or line.strip() == "python -m bench"]


def first_of_each_sweep(args: list[str]) -> list[str]:
    """A sweep's first combination (``a=1,2`` -> ``a=1``); Hydra's own keys stay with Hydra."""
    out = []
    for a in args:
        if a == "--multirun" or a.startswith("hydra") or "=" not in a:
            continue
        key, value = a.split("=", 1)
        out.append(f"{key}={value.split(',')[0]}" if "," in value and not re.search(r"[\[\]{}]", value) else a)
    return out


def test_the_readme_lists_commands():
    assert len(readme_commands()) >= 10


@pytest.mark.parametrize("command", readme_commands())
def test_a_readme_command_validates_as_typed(command):
    overrides = first_of_each_sweep(shlex.split(command)[3:])
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        # a preset's own sweep (hydra.sweeper.params, e.g. its models): its first combination too
        params = compose("config", overrides=overrides, return_hydra_config=True).hydra.sweeper.get("params") or {}
        given = {o.split("=", 1)[0] for o in overrides}
        overrides += first_of_each_sweep([f"{k}={v}" for k, v in params.items() if k not in given])
        validate(compose("config", overrides=overrides), gpus=8)

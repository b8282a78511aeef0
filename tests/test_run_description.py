"""One typed run description: built once from the composed config, read by attribute everywhere else.

bench/run/config.py ``describe_run`` turns the composed config (plain containers) into ``plan.run``, a BenchConfig
whose sections are the schemas' dataclasses (the model's, the strategy's own, the hardware's).  These checks keep
it so: the sections cannot be read by key at all (so any path the suite runs would fail on a key read), no module
reads a plan's configuration by key (so the paths the suite does not run cannot either), and a strategy reads its
layout from ``plan.layout``, not from its own layout knobs.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the builder: the composed config's plain containers are read by key here, to build and validate the description
# and to key and record a run from its plain form
BUILDER = {"bench/run/config.py", "bench/spec/schema.py", "bench/run/tuning_profiles.py", "bench/run/runs.py",
           "bench/models/hf_config.py"}
# a plan's configuration: plan.cfg (its plain record), plan.run and its sections, and their aliases on the plan
CONFIG = re.compile(r"(^|\.)(plan|run)\.(cfg|run|model|strategy|hardware|optim|metrics|fault|logger)$|\.cfg$")


def _modules(*roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (REPO / r).rglob("*.py"))


def _text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001
        return ""


def key_reads(source: str) -> list[tuple[int, str]]:
    """Each ``<config>["key"]`` and ``<config>.get("key")`` where <config> is a plan's configuration (CONFIG)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        recv = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            recv = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop",
              "setdefault") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            recv = node.func.value
        if recv is not None and CONFIG.search(_text(recv)):
            hits.append((node.lineno, _text(node)))
    return hits


def layout_knob_reads(source: str, knobs: tuple[str, ...]) -> list[tuple[int, str]]:
    """Each read of a layout knob from a strategy section (``plan.strategy.tp``, ``self.plan.strategy.cp``)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in knobs and _text(node.value).endswith("strategy"):
            hits.append((node.lineno, _text(node)))
    return hits


def test_the_sections_of_a_run_cannot_be_read_by_key():
    from hydra import compose, initialize_config_dir

    from bench.machine.hardware import HardwareConfig
    from bench.run.config import register_configs, validate

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        plan = validate(compose("config", overrides=["strategy=fsdp", "world_size=2", "model=llama3_8b",
                                                     "dry_run=true", "hardware=h100_sxm_80gb"]), gpus=0)
    for section in (plan.run, plan.model, plan.strategy, plan.run.hardware, plan.run.optim, plan.run.metrics):
        assert dataclasses.is_dataclass(section)
        with pytest.raises(TypeError):
            section["name" if hasattr(section, "name") else "lr"]  # noqa: B018 - the read itself is the check
        assert not hasattr(section, "get")
    assert isinstance(plan.run.hardware, HardwareConfig)
    assert plan.cfg["model"]["d_model"] == plan.model.d_model == 4096  # the plain record says what the description says


def test_no_module_reads_a_plans_configuration_by_key():
    bad = []
    for path in _modules("bench", "multirun_analysis", "hydra_plugins"):
        rel = str(path.relative_to(REPO))
        if rel in BUILDER:
            continue
        bad += [f"{rel}:{line}: {text}" for line, text in key_reads(path.read_text())]
    assert not bad, "read the typed run description (plan.run.x, plan.model.x, plan.strategy.x, plan.layout.x):\n" + \
        "\n".join(bad)


def test_strategies_read_their_layout_from_the_layout():
    from bench.spec.schema import LAYOUT_KNOBS

    knobs = (*LAYOUT_KNOBS, "micro_batch_size")
    bad = []
    for path in _modules("bench/strategies", "bench/parallel"):
        bad += [f"{path.relative_to(REPO)}:{line}: {text}" for line, text in layout_knob_reads(path.read_text(), knobs)]
    assert not bad, "read plan.layout (built once by bench/spec/layout_rules.py):\n" + "\n".join(bad)


def test_the_checks_find_what_they_look_for():
    assert [t for _, t in key_reads("x = plan.cfg['precision']\ny = self.plan.model.get('d_model')\n"
                                    "z = row.plan.strategy['tp']\nw = record['config']['model']\n")] == \
        ["plan.cfg['precision']", "self.plan.model.get('d_model')", "row.plan.strategy['tp']"]
    assert key_reads("mem['needed_mb']\nplan.run.model.d_model\n") == []
    assert [t for _, t in layout_knob_reads("a = plan.strategy.tp\nb = plan.layout.tp\nc = self.plan.strategy.cp\n",
                                            ("tp", "cp"))] == ["plan.strategy.tp", "self.plan.strategy.cp"]

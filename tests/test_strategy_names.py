"""Nothing outside a strategy's own module names it: what generic code needs to know about a strategy
(memory terms, buffers, labels, the baseline, which figure compares its variants) is declared on its
StrategySpec, so adding a strategy touches only its module (and its YAML)."""
from __future__ import annotations

import ast
from pathlib import Path

from bench.strategies.registry import specs
from bench.layout import Layout

REPO = Path(__file__).resolve().parents[1]
GENERIC = [REPO / "bench", REPO / "multirun_analysis"]
OWN = REPO / "bench" / "strategies"
# tp and pp are also the layout's dimensions (plan.tp, the mesh's "tp"), which generic code may name
LAYOUT_DIMS = {f for f in Layout.__dataclass_fields__}


def strategy_words() -> set[str]:
    """Every registered strategy's name, less the layout's dimension names.  (Library names such as
    "deepspeed" or "megatron.core" are not strategy names: provenance records their versions.)"""
    return set(specs()) - LAYOUT_DIMS


def string_constants(tree: ast.AST):
    """(line, value) of every string constant that is not a docstring."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def offences() -> list[str]:
    words = strategy_words()
    out = []
    for root in GENERIC:
        for path in sorted(root.rglob("*.py")):
            if OWN in path.parents:
                continue
            for line, value in string_constants(ast.parse(path.read_text(), str(path))):
                if value in words:
                    out.append(f"{path.relative_to(REPO)}:{line}: {value!r}")
    return out


def test_the_words_checked_include_every_strategy():
    words = strategy_words()
    assert {"single", "ddp", "fsdp", "zero", "megatron"} <= words and not words & {"tp", "pp"}, words


def test_no_strategy_is_named_outside_its_module():
    found = offences()
    assert not found, "strategy names outside bench/strategies/ (declare the fact on the StrategySpec):\n" + \
        "\n".join(found)


def test_the_check_finds_a_name(tmp_path):
    """The check itself can fail: a comparison with a strategy name is an offence, its docstring is not."""
    tree = ast.parse('"""zero"""\nif s["name"] == "zero":\n    pass\n')
    assert [v for _, v in string_constants(tree) if v in strategy_words()] == ["zero"]

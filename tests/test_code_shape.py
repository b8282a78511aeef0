"""Code shape: no function in bench/ or multirun_analysis/ over 60 lines, no class over 200.

A node's length is ``end_lineno - lineno + 1`` of its ``def`` / ``class`` statement (decorators
excluded; a nested function counts on its own and inside its parent).  An offender is printed as
``path:line name N lines``.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "multirun_analysis")
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 200


def offenders() -> list[str]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    limit = MAX_FUNCTION_LINES
                elif isinstance(node, ast.ClassDef):
                    limit = MAX_CLASS_LINES
                else:
                    continue
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} {n} lines")
    return out


def test_no_long_functions_or_classes():
    found = offenders()
    for line in found:
        print(line)
    assert not found, (f"functions over {MAX_FUNCTION_LINES} lines / classes over {MAX_CLASS_LINES} lines "
                       "(split them into named steps):\n" + "\n".join(found))

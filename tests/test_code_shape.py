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


# ------------------------------------------------------------------------------ modules and imports
MAX_MODULE_LINES = 400


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the packages (a package's __init__ under the package's name)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the packages that ``name`` imports, by every import statement in it, those inside
    functions included (``from a import b`` names the module a.b where b is one, else a)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def test_no_import_cycle():
    """No module of bench/ or multirun_analysis/ imports itself back through others (graphlib finds a cycle
    as it orders the graph)."""
    import graphlib

    try:
        tuple(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


def test_the_cycle_check_finds_a_cycle():
    import graphlib

    with __import__("pytest").raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).static_order())
    graph = import_graph()
    assert "bench.schema" in graph["bench.config"]  # a real edge is read


def test_no_module_over_400_lines():
    long = [f"{p.relative_to(REPO)} {n} lines" for p in modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split by meaning):\n" + "\n".join(long)

"""Code shape: no function in bench/ or multirun_analysis/ over 60 lines, no class over 200.

A node's length is ``end_lineno - lineno + 1`` of its ``def`` / ``class`` statement (decorators
excluded; a nested function counts on its own and inside its parent).  An offender is printed as
``path:line name N lines``.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.ast_checks import compares_key_with_text

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
    assert "bench.spec.schema" in graph["bench.run.config"]  # a real edge is read


def package_of(module: str) -> str:
    """The folder a module lives in, as one unit: ``bench.<package>`` (or a top-level module of bench), or
    ``multirun_analysis``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "bench" and len(parts) > 1 else parts[0]


def package_graph() -> dict[str, set[str]]:
    """The import graph with each folder folded into one node (imports inside a folder dropped)."""
    out: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        out.setdefault(package_of(name), set()).update(package_of(t) for t in targets)
    return {p: deps - {p} for p, deps in out.items()}


def test_the_folders_are_layers():
    """No folder imports back a folder that imports it (docs/development.md lists them top down): a module that
    both sits below others and imports above them belongs in another folder."""
    import graphlib

    graph = package_graph()
    assert "bench.spec" in graph["bench.run"] and "bench.costs" in graph["bench.strategies"]  # real edges are read
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"folders import each other: {' -> '.join(e.args[1])}") from None


def test_no_module_over_400_lines():
    long = [f"{p.relative_to(REPO)} {n} lines" for p in modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split by meaning):\n" + "\n".join(long)


# ------------------------------------------------------------------------------ the model description
# where a model's architecture may be named: the description (bench/models/model_spec.py), the modules that build it
# (bench/models/model.py; Megatron's build, bench/strategies/megatron/model.py) and the reader of Hugging Face configs
ARCH_MODULES = ("bench/models/model_spec.py", "bench/models/model.py", "bench/models/hf_config.py", "bench/strategies/megatron/model.py")


def arch_comparisons(source: str, name: str = "<source>") -> list[str]:
    """``name:line`` of every comparison of a model's arch with a string in ``source``."""
    return [f"{name}:{node.lineno}" for node in ast.walk(ast.parse(source, filename=name))
            if compares_key_with_text(node, "arch")]


def test_no_arch_branches_outside_the_model_description():
    """What differs between model families is a method of bench/models/model_spec.py's description, not an
    ``arch == "llama"`` branch in the memory plan, traffic, FLOPs or validation."""
    found = [hit for pkg in PACKAGES for path in sorted((REPO / pkg).rglob("*.py"))
             if str(path.relative_to(REPO)) not in ARCH_MODULES
             for hit in arch_comparisons(path.read_text(), str(path.relative_to(REPO)))]
    assert not found, ("arch compared with a string outside the model description (ask "
                       "bench.models.model_spec.describe_model(model) instead):\n" + "\n".join(found))


def test_the_arch_check_finds_comparisons():
    code = ('a = m.get("arch", "gpt") == "llama"\nb = cfg["model"]["arch"] != "gpt"\nc = arch in ("gpt", "x")\n'
            'd = "llama" == self.arch\ne = m.get("arch") == other\nf = n_layers == "2"\n')
    assert arch_comparisons(code) == ["<source>:1", "<source>:2", "<source>:3", "<source>:4"]
    assert all((REPO / p).is_file() for p in ARCH_MODULES)  # an exemption names a file that exists


# ------------------------------------------------------------------------------ the layout, read as one object
# The layout knobs a strategy's schema may have, and the top-level one: validation reads them into plan.layout
# (bench/spec/layout_rules.py ``build``); generic code reads the layout object, never the knobs again.
STRATEGY_LAYOUT_KEYS = {"tp", "pp", "microbatches", "virtual_pipeline", "schedule", "dp_replicate"}
CONFIG_LAYOUT_KEYS = {"recompute"}
LAYOUT_READERS_ALLOWED = {
    "bench/spec/layout_rules.py": "builds plan.layout from the knobs",
    # whether the user set strategy.microbatches (the layout holds the resolved count): before there is a plan,
    # and of recorded runs' configurations
    "bench/run/tuning_profiles.py": "before there is a plan",
    "bench/plan/bests.py": "recorded runs' configurations",
}


def _section(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """"strategy" / "cfg" when ``node`` is that dict: x.strategy, x["strategy"], x.cfg, or a name bound to one."""
    if isinstance(node, ast.Attribute) and node.attr in ("strategy", "cfg"):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "strategy":
        return "strategy"
    return aliases.get(node.id) if isinstance(node, ast.Name) else None


def _aliases(scope: ast.AST) -> dict[str, str]:
    """Names a scope binds to a strategy or config dict (``s = plan.strategy``, ``s, m = plan.strategy, ...``)."""
    out: dict[str, str] = {}
    for node in ast.walk(scope):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            pairs = zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and \
                isinstance(node.value, ast.Tuple) else [(target, node.value)]
            for t, v in pairs:
                if isinstance(t, ast.Name) and (sec := _section(v, out)):
                    out[t.id] = sec
    return out


def _layout_key_read(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The layout key ``node`` reads out of a strategy / config dict (``d["k"]``, ``d.get("k", ...)``), if any."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        obj, key = node.value, node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        obj, key = node.func.value, node.args[0]
    else:
        return None
    if not isinstance(key, ast.Constant):
        return None
    keys = {"strategy": STRATEGY_LAYOUT_KEYS, "cfg": CONFIG_LAYOUT_KEYS}.get(_section(obj, aliases) or "", set())
    return key.value if key.value in keys else None


def layout_reads(source: str) -> list[tuple[int, str]]:
    """(line, key) of every read of a layout knob out of a strategy or config dict in ``source``."""
    tree = ast.parse(source)
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = set()
    for scope in scopes:
        aliases = _aliases(scope)
        found |= {(n.lineno, k) for n in ast.walk(scope) if (k := _layout_key_read(n, aliases))}
    return sorted(found)


def test_generic_code_reads_the_layout_object_not_the_knobs():
    """Outside bench/strategies/ (a strategy reads its own knobs) and the layout's builder, tp, pp, the pipeline's
    knobs, dp_replicate and recompute come from plan.layout."""
    found = []
    for path in modules().values():
        rel = str(path.relative_to(REPO))
        if rel.startswith("bench/strategies/") or rel in LAYOUT_READERS_ALLOWED:
            continue
        found += [f"{rel}:{line} reads {key!r}" for line, key in layout_reads(path.read_text())]
    assert not found, "read these from plan.layout (bench/spec/layout.py Layout):\n" + "\n".join(found)


def test_the_layout_read_check_finds_reads():
    src = '''
def f(plan, cfg):
    s, m = plan.strategy, plan.model
    c = plan.cfg
    a = s.get("virtual_pipeline", 1) + s["pp"] + cfg["strategy"]["schedule"] + plan.strategy.get("dp_replicate")
    b = c["recompute"], m["n_layers"], s["name"], plan.layout.schedule, plan.layout.recompute
    return plan.cfg.get("recompute")
'''
    assert layout_reads(src) == [(5, "dp_replicate"), (5, "pp"), (5, "schedule"), (5, "virtual_pipeline"),
                                 (6, "recompute"), (7, "recompute")]

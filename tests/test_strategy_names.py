"""Nothing outside a strategy's own module names it: what generic code needs to know about a strategy
(memory terms, buffers, labels, the baseline, which figure compares its variants) is declared on its
StrategySpec, so adding a strategy touches only its module (and its YAML).

The check reads identifiers and strings, by word part: ``fsdp_mixed``, ``MegatronModelParallel`` and
``"strategy.impl=megatron"`` name a strategy as much as ``"megatron"`` does.  Prose is English: only its compound
tokens (``strategy=ddp``) are read, not its plain words ("a single run")."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from bench.spec.layout import Layout
from bench.strategies.registry import specs
from tests.ast_checks import compares_key_with_text

REPO = Path(__file__).resolve().parents[1]
GENERIC = [REPO / "bench", REPO / "multirun_analysis"]
OWN = REPO / "bench" / "strategies"
# tp and pp are also the layout's dimensions (plan.tp, the mesh's "tp"), which generic code may name
LAYOUT_DIMS = {f for f in Layout.__dataclass_fields__}

# What generic code may write although a word part is a strategy's name: {identifier or compound token: the one
# file it may appear in, or "*"}.  A string that is exactly a strategy's name is never allowed.
ALLOWED = {
    # the top-level shorthand for strategy.zero_stage, and its knob's documentation
    **dict.fromkeys(("zero_stage", "strategy.zero_stage", "strategy=zero", "zero_stage=3"), "bench/spec/schema.py"),
    # the library, as provenance and teardown record it
    **dict.fromkeys(("megatron.core", "megatron-core", "megatron_core"), "*"),
    # torch's data-parallel wrappers, which the policies of several strategies apply
    **dict.fromkeys(("ddp", "apply_ddp", "TorchDDP", "apply_fsdp", "FSDP2", "torch.distributed.fsdp.fully_shard"),
                    "bench/parallel/dp.py"),
    # torchao's float8 all-gather for FSDP2 (bench/parallel/float8.py names its switch after it)
    **dict.fromkeys(("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                     "fsdp_float8_all_gather"), "*"),
    # torch's and English words: zero as a number, one run, one device
    **dict.fromkeys(("zero_grad", "allow_zero", "all_gather_single", "reduce_scatter_single", "single",
                     "SINGLE_RUN_EXIT", "hydra_plugins.bench_plugins.callbacks.SingleRunSweepCallback",
                     "single-device"), "*"),
    # advice in the messages of the torch-native layout rules, which the tp / pp family and fsdp share
    **dict.fromkeys(("strategy=fsdp", "strategy.impl=megatron"), "bench/spec/layout_rules.py"),
}
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_TOKEN = re.compile(r"[\w.=/-]+")


def strategy_words() -> set[str]:
    """Every registered strategy's name, less the layout's dimension names."""
    return set(specs()) - LAYOUT_DIMS


def word_parts(text: str) -> set[str]:
    """fsdp_mixed -> {fsdp, mixed}; MegatronModelParallel -> {megatron, model, parallel}; FSDP2 -> {fsdp, 2}."""
    return {p.lower() for p in _PART.findall(text)}


def string_tokens(value: str) -> list[str]:
    """A string without spaces is one key, name or path (all its tokens are read); in prose, the compound ones."""
    tokens = _TOKEN.findall(value)
    return tokens if not re.search(r"\s", value) else [t for t in tokens if re.search(r"[_.=/-]", t)]


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _identifier(node: ast.AST):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.arg):
        return node.arg
    if isinstance(node, ast.keyword):
        return node.arg
    if isinstance(node, ast.alias):
        return node.asname or node.name
    return None


def names_in(tree: ast.AST, words: set[str]):
    """(line, text, exact) of every string that is exactly a name (``exact``), and of every identifier and string
    token otherwise (docstrings skipped)."""
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if node.value in words:
                yield line, node.value, True
            else:
                yield from ((line, t, False) for t in string_tokens(node.value))
        elif (name := _identifier(node)) is not None:
            yield line, name, False


def offences_in(source: str, rel: str, words: set[str]) -> list[str]:
    return [f"{rel}:{line}: {text!r}" for line, text, exact in sorted(names_in(ast.parse(source), words))
            if exact or (word_parts(text) & words and ALLOWED.get(text) not in ("*", rel))]


def offences() -> list[str]:
    words, out = strategy_words(), []
    for root in GENERIC:
        for path in sorted(root.rglob("*.py")):
            if OWN not in path.parents:
                out += offences_in(path.read_text(), str(path.relative_to(REPO)), words)
    return out


def test_the_words_checked_include_every_strategy():
    words = strategy_words()
    assert {"single", "ddp", "fsdp", "zero", "megatron"} <= words and not words & {"tp", "pp"}, words


def test_no_strategy_is_named_outside_its_module():
    found = offences()
    assert not found, "strategy names outside bench/strategies/ (declare the fact on the StrategySpec):\n" + \
        "\n".join(found)


def test_the_check_finds_a_name():
    """The check itself can fail: a comparison with a name, a compound key, an identifier, a name inside a
    string's key; not a docstring, English prose, or an allowed library name."""
    words = strategy_words()
    source = ('"""zero"""\nif s["name"] == "zero":\n    b = BYTES["fsdp_mixed"]\nmegatron_mixed = 1\n'
              'x = MegatronModelParallel\nmsg = "use strategy.impl=megatron here"\nok = "a single run"\n'
              'lib = "megatron.core"\nif impl == "megatron":\n    pass\n')
    found = [o.split(": ", 1)[1] for o in offences_in(source, "bench/x.py", words)]
    assert found == ["'zero'", "'fsdp_mixed'", "'megatron_mixed'", "'MegatronModelParallel'",
                     "'strategy.impl=megatron'", "'megatron'"], found
    # an allowance holds in its own file only
    assert offences_in('m = "strategy=fsdp"', "bench/spec/layout_rules.py", words) == []
    assert offences_in('m = "strategy=fsdp"', "bench/run/config.py", words) == ["bench/run/config.py:1: 'strategy=fsdp'"]


# ------------------------------------------------------------------------------ implementation switches
SWITCH_OWNER = OWN / "megatron"  # the one implementation that may test which one runs: its own rule


def impl_switches(source: str) -> list[int]:
    """Lines comparing strategy.impl with a value (==, !=, in, not in)."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if compares_key_with_text(node, "impl")]


def test_no_implementation_switch_outside_the_implementation():
    """The tp x pp x dp family asks its Implementation object (bench/strategies/model_parallel.py); only
    megatron-core's own module may test the knob (strategy=megatron runs nothing else)."""
    found = [f"{p.relative_to(REPO)}:{line}" for root in GENERIC for p in sorted(root.rglob("*.py"))
             if SWITCH_OWNER not in p.parents for line in impl_switches(p.read_text())]
    assert not found, "implementation switches (ask the family's Implementation object):\n" + "\n".join(found)


def test_the_switch_check_finds_a_switch():
    src = ('if s["impl"] == "megatron": pass\nif impl != "torch": pass\nif v.get("impl") not in (None, "torch"): pass\n'
           'if plan.impl == other: pass\nif impl in IMPLEMENTATIONS: pass\n')
    assert impl_switches(src) == [1, 2, 3]

"""AST helpers the code-shape checks share: does an expression read a given key, is it a string constant."""
from __future__ import annotations

import ast


def reads_key(node: ast.AST, key: str) -> bool:
    """``key``, ``x.key``, ``x["key"]`` or ``x.get("key", ...)``."""
    if isinstance(node, ast.Name):
        return node.id == key
    if isinstance(node, ast.Attribute):
        return node.attr == key
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == key
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == key)


def is_text(node: ast.AST) -> bool:
    """A string, or a tuple / list / set holding one (``arch in ("gpt", ...)``, ``impl not in (None, "torch")``)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(is_text(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def compares_key_with_text(node: ast.AST, key: str) -> bool:
    """A comparison of ``key`` (read as above) with a string constant."""
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    return any(reads_key(s, key) for s in sides) and any(is_text(s) for s in sides)

"""Writes docs/knobs.md, the reference of every configuration key, from the dataclass schemas.

Why: every default, valid choice, knob-search candidate and one-line explanation already lives in
the schemas (bench/schema.py, and each strategy's module, found through the strategy registry),
declared with ``bench.schema.knob``. A hand-kept table drifts from them; a generated one cannot, and
tests/test_docs.py fails when the committed file differs from what :func:`render` returns.

    python -m bench.docgen            # (re)write docs/knobs.md
    python -m bench.docgen --check    # exit 1 if docs/knobs.md is stale
"""
from __future__ import annotations

import dataclasses
import re
import sys
import typing
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING

from bench.hardware import PRESETS, HardwareConfig
from bench.strategies.registry import specs
from bench.schema import BenchConfig

OUT = Path(__file__).resolve().parent.parent / "docs" / "knobs.md"
ALIAS = re.compile(r"^\$\{bench_alias:(\w+),(.*)\}$")  # a default written by bench.schema.alias_default
HEAD = ["| key | default | valid choices | search candidates | what it does |", "|---|---|---|---|---|"]


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:g}" if isinstance(v, float) else str(v)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ").strip()


def _list(values: Optional[tuple]) -> str:
    return ", ".join(f"`{_value(v)}`" for v in values) if values else ""


def _nested(f: dataclasses.Field, hint: Any) -> Optional[type]:
    """The dataclass a field holds (its type or its default factory), else None."""
    for t in (hint, f.default_factory):
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    return None


def rows(schema: type, prefix: str, nested: bool = True, choices: Optional[dict] = None) -> list[str]:
    """One table row per field, as declared; nested dataclasses flattened to dotted keys (or skipped)."""
    hints, out = typing.get_type_hints(schema), []
    for f in dataclasses.fields(schema):
        sub = _nested(f, hints.get(f.name))
        if sub is not None:
            out += rows(sub, f"{prefix}{f.name}.") if nested else []
            continue
        md, note = f.metadata or {}, ""
        if f.default_factory is not dataclasses.MISSING:
            default = f"`{_value(f.default_factory())}`"
        elif f.default is MISSING:
            default = "(preset)"
        elif isinstance(f.default, str) and ALIAS.match(f.default):
            alias, value = ALIAS.match(f.default).groups()
            default, note = f"`{value}`", f"shorthand: top-level `{alias}=`. "
        else:
            default = f"`{_cell(_value(f.default))}`"
        valid = md.get("choices") or (choices or {}).get(f.name)
        out.append(f"| `{prefix}{f.name}` | {default} | {_list(valid)} | {_list(md.get('tune'))} | "
                   f"{_cell(note + (md.get('doc') or ''))} |")
    return out


def render() -> str:
    strategies = dict(sorted(specs().items()))
    md = ["# Configuration keys (generated)", "",
          "Every key bench reads: its default, its valid choices, the candidates the knob search "
          "(`+experiment=tune`) tries, and what it does. Generated from the schemas in `bench/schema.py` and "
          "`bench/strategies/` by `python -m bench.docgen`; do not edit by hand. Set a key as a Hydra override "
          "(`python -m bench key=value`). The trade-offs and measurements behind the strategy knobs are in "
          "[strategies.md](strategies.md). `(preset)`: set by the chosen `model=` preset or config group.",
          "", "## Top level", ""]
    md += HEAD + rows(BenchConfig, "", nested=False, choices={"strategy": tuple(strategies)}) + [""]
    hints = typing.get_type_hints(BenchConfig)
    for f in dataclasses.fields(BenchConfig):
        sub = _nested(f, hints.get(f.name))
        if sub is not None:
            md += [f"## {f.name}", ""] + HEAD + rows(sub, f"{f.name}.") + [""]
    md += ["## hardware", "", "`hardware=<preset>` (bench/hardware.py): " + ", ".join(
        f"`{n}` ({p.gpu}, {p.memory_gib:g} GiB)" for n, p in PRESETS.items()) + "; any key can be overridden "
        "(`hardware.memory_gib=70`).", ""] + HEAD + rows(HardwareConfig, "hardware.") + [""]
    for name, spec in strategies.items():
        md += [f"## strategy={name}", "", f"{spec.summary}.", ""] + HEAD + rows(spec.schema, "strategy.") + [""]
    return "\n".join(md)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run `python -m bench.docgen` and commit it", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

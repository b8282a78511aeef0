"""Writes docs/knobs.md, the reference of every configuration key, from the dataclass schemas, and the numbers
README.md and docs/*.md quote from a record (QUOTES).

Why: every default, valid choice, knob-search candidate and one-line explanation already lives in
the schemas (bench/spec/schema.py, and each strategy's module, found through the strategy registry),
declared with ``bench.spec.schema.knob``. A hand-kept table drifts from them; a generated one cannot, and
tests/test_docs.py fails when the committed file differs from what :func:`render` returns.

    python -m bench.docgen            # (re)write docs/knobs.md and every quoted number
    python -m bench.docgen --check    # exit 1 if docs/knobs.md or a quoted number is stale

A quoted number (``Quote``): a pattern on a page whose groups are the numbers as printed, and the record they
come from (bench/plan/calibration.json, a results folder's README); the page is rewritten where they differ, and
tests/test_docs.py fails until it is.  docs/results.md's calibration block is rendered whole by
``python -m bench.calibrate`` (bench/plan/calibration_error.py); the memory plan's accuracy it quotes, from the recorded
runs re-planned, by ``python -m multirun_analysis.quoted`` (its quotes, on this module's Quote).
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
import typing
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import MISSING

from bench.machine.hardware import PRESETS, HardwareConfig
from bench.strategies.registry import specs
from bench.spec.schema import BenchConfig

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "knobs.md"
ALIAS = re.compile(r"^\$\{bench_alias:(\w+),(.*)\}$")  # a default written by bench.spec.schema.alias_default
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
          "(`+experiment=tune`) tries, and what it does. Generated from the schemas in `bench/spec/schema.py` and "
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
    md += ["## hardware", "", "`hardware=<preset>` (bench/machine/hardware.py): " + ", ".join(
        f"`{n}` ({p.gpu}, {p.memory_gib:g} GiB)" for n, p in PRESETS.items()) + "; any key can be overridden "
        "(`hardware.memory_gib=70`).", ""] + HEAD + rows(HardwareConfig, "hardware.") + [""]
    for name, spec in strategies.items():
        md += [f"## strategy={name}", "", f"{spec.summary}.", ""] + HEAD + rows(spec.schema, "strategy.") + [""]
    return "\n".join(md)


@dataclasses.dataclass(frozen=True)
class Quote:
    page: str  # relative to the repository's root
    pattern: str  # a regex that matches once on the page; its groups are the quoted numbers as printed
    source: str  # the record, as a reader finds it
    values: Callable[[], tuple]  # the numbers as the record gives them, printed as the page prints them


def _calibration() -> dict:
    return json.loads((ROOT / "bench" / "plan" / "calibration.json").read_text())


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _held_out() -> tuple:
    e = _calibration()["error"]
    return _pct(e["median_abs"]), _pct(e["p90_abs"]), f"{e['runs']:,}"


def _folder_median(folder: str) -> Callable[[], tuple]:
    return lambda: (_pct(_calibration()["per_folder"][folder]["median_abs"]),)


def _last_match(page: str, pattern: str) -> Callable[[], tuple]:
    """The groups of the pattern's last match on a record page (a results folder's later note replaces earlier)."""
    def values() -> tuple:
        hits = re.findall(pattern, (ROOT / page).read_text())
        if not hits:
            raise LookupError(f"{page} no longer says {pattern!r}")
        return hits[-1] if isinstance(hits[-1], tuple) else (hits[-1],)
    return values


EDGE = "results/2026-11-27-h100x4-edge/README.md"
QUOTES = (
    Quote("README.md", r"held out by folder: median (\d+\.\d%), 90th percentile (\d+\.\d%) over ([\d,]+) runs",
          "bench/plan/calibration.json: error", _held_out),
    Quote("README.md", r"predicted off its calibration with the probe's link (−\d+\.\d%) \(DDP\) and (−\d+\.\d%) \(FSDP2\)",
          f"{EDGE}: its later note", _last_match(EDGE, r"predicted\s+(−\d+\.\d%) \(DDP\) and (−\d+\.\d%) \(FSDP2\)")),
    Quote("docs/results.md", r"the throughput prediction, out of sample, had a median error of (\d+\.\d%)",
          "bench/plan/calibration.json: per_folder 2026-11-26-h200x4-llama8b", _folder_median("2026-11-26-h200x4-llama8b")),
    Quote("docs/results.md", r"held-out throughput prediction beside its measurement \(median error (\d+\.\d%)",
          "bench/plan/calibration.json: per_folder 2026-11-25-h200x2-llama-predict",
          _folder_median("2026-11-25-h200x2-llama-predict")),
)


def _requote(q: Quote, text: str) -> tuple[str, Optional[str]]:
    """The page's text with the quote's numbers from its record, and what was wrong (None: nothing)."""
    hits = list(re.finditer(q.pattern, text))
    if len(hits) != 1:
        return text, f"{q.page}: {len(hits)} matches of {q.pattern!r} (want 1): reword the pattern or the page"
    m, want = hits[0], tuple(q.values())
    if m.groups() == want:
        return text, None
    new = text[:m.start()] + "".join(
        text[(m.end(i - 1) if i > 1 else m.start()):m.start(i)] + want[i - 1] for i in range(1, len(want) + 1)) \
        + text[m.end(len(want)):]
    return new, f"{q.page} quotes {' / '.join(m.groups())} where {q.source} says {' / '.join(want)}"


def stale_quotes(pages: Optional[dict] = None, quotes=QUOTES) -> list[str]:
    """One line per quoted number that differs from its record (``pages``: page -> text, default the files)."""
    out = []
    for q in quotes:
        text = (pages or {}).get(q.page)
        _, wrong = _requote(q, text if text is not None else (ROOT / q.page).read_text())
        out += [wrong] if wrong else []
    return out


def write_quotes(quotes=QUOTES) -> list[str]:
    """Rewrite every stale quoted number from its record; returns what changed."""
    changed = []
    for q in quotes:
        path = ROOT / q.page
        new, wrong = _requote(q, path.read_text())
        if wrong and new != path.read_text():
            path.write_text(new)
        changed += [wrong] if wrong else []
    return changed


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        stale = ([f"{OUT} is stale"] if not OUT.exists() or OUT.read_text() != text else []) + stale_quotes()
        for line in stale:
            print(f"{line}: run `python -m bench.docgen` and commit it", file=sys.stderr)
        return 1 if stale else 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    for line in write_quotes():
        print(f"rewrote: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

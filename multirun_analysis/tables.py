"""Markdown and terminal tables: a column spec is (column, heading, format), format a str.format
pattern, "pct" (a fraction shown in percent) or a callable; a missing value shows as "–"."""
from __future__ import annotations

import math

import pandas as pd


def _cell(v, fmt) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    try:
        if fmt == "pct":
            return f"{100 * float(v):.1f}"
        return fmt(v) if callable(fmt) else fmt.format(float(v))
    except (TypeError, ValueError):
        return str(v)


def table_rows(df: pd.DataFrame, spec):
    """Headings and cells; a "GPUs" heading names the devices the rows ran on (devices_word)."""
    spec = [s for s in spec if s[0] in df.columns]
    heads = [devices_word(df) if h == "GPUs" else h for _, h, _ in spec]
    return heads, [[_cell(r[c], f) for c, _, f in spec] for _, r in df.iterrows()]


def device_types(df: pd.DataFrame) -> set:
    """The device types rows ran on (device_type, else the config's device): {"cpu"}, {"cuda"}, both, or none known."""
    for c in ("device_type", "device"):
        if df is not None and c in df.columns:
            got = {t.strip() for x in df[c].dropna() for t in str(x).split(",")} - {"", "auto", "None"}
            if got:
                return got
    return set()


def devices_word(df: pd.DataFrame, n: float | None = None) -> str:
    """What world_size counts: "GPUs", "CPU ranks", or "devices" where both ran; with n: "1 GPU", "2 CPU ranks"."""
    types = device_types(df)
    word = "CPU rank" if types == {"cpu"} else "device" if len(types) > 1 or types - {"cuda", "cpu"} else "GPU"
    if n is None:
        return word + "s"
    return f"{float(n):g} {word}" + ("" if float(n) == 1 else "s")


def md_table(df: pd.DataFrame, spec) -> str:
    heads, rows = table_rows(df, spec)
    if not rows:
        return "_(none)_\n"
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plain(v):
    """A cell as a plain Python value (numpy scalars unwrapped), None for NaN or missing: NaN == NaN in keys."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def fmt_value(v) -> str:
    """A cell as text (a whole float without its .0)."""
    v = plain(v)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def key_columns(summary: pd.DataFrame) -> list[str]:
    """The experiment-key columns of a summary (attrs, or the columns before ``label``)."""
    if summary.attrs.get("key_columns"):
        return list(summary.attrs["key_columns"])
    cols = list(summary.columns)
    return cols[:cols.index("label")] if "label" in cols else []

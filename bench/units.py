"""Numbers as a reader reads them."""
from __future__ import annotations


def count_text(n) -> str:
    """A count (parameters, tokens) with its suffix, three significant digits: 7.29M, 1.24B, 8.03B, 950K."""
    n = float(n)
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:g}"

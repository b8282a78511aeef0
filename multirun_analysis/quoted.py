"""The numbers docs/results.md quotes from every recorded GPU run re-planned by today's code (results/*/runs.json
through multirun_analysis/prediction.py): the memory plan's accuracy.  They use bench.docgen's ``Quote`` (the same
check and rewrite as the numbers quoted from bench/plan/calibration.json); they live here because their record is this
package's re-planning, which bench.docgen does not import.

    python -m multirun_analysis.quoted            # rewrite the stale ones
    python -m multirun_analysis.quoted --check    # exit 1 where one is stale (tests/test_docs.py checks the same)
"""
from __future__ import annotations

import functools
import math
import sys

from bench.docgen import ROOT, Quote, stale_quotes, write_quotes

SOURCE = "results/*/runs.json re-planned (python -m multirun_analysis.prediction results/)"


@functools.lru_cache(maxsize=1)
def _memory() -> dict:
    """The memory plan's errors over the completed recorded runs (signed %, predicted against measured peak)."""
    from multirun_analysis.prediction import prediction_table

    t = prediction_table([str(ROOT / "results")])
    done = t[(t["status"] == "completed") & t["peak_error_pct"].notna()]
    err = done["peak_error_pct"].astype(float)
    fp8 = err[done["precision"].astype(str).str.startswith("fp8")]
    oom = t[t["status"] == "oom"]
    return {"runs": len(done), "within_10": float((err.abs() <= 10).mean()), "over_15": int((err.abs() > 15).sum()),
            "worst": float(err[err.abs().idxmax()]), "fp8": (float(fp8.min()), float(fp8.max())) if len(fp8) else None,
            "completed_not_fit": int((t[t["status"] == "completed"]["predicted_fits"] == False).sum()),  # noqa: E712
            "oom": len(oom),
            "oom_fit": int(((oom["predicted_fits"] == True) & (oom["predicted_tight"] != True)).sum())}  # noqa: E712


def signed(x: float) -> str:
    """A signed percentage as the docs print it: +8.3%, −5.7% (a minus sign, not a hyphen)."""
    return ("−" if x < 0 else "+") + f"{abs(x):.1f}%"


def _within_10() -> tuple:
    m = _memory()
    return f"{100 * m['within_10']:.1f}%", str(m["runs"])


def _fp8() -> tuple:
    lo, hi = _memory()["fp8"] or (math.nan, math.nan)
    return signed(lo), signed(hi)


def _over_15() -> tuple:
    m = _memory()
    return str(m["over_15"]), signed(m["worst"])


RESULTS = "docs/results.md"
QUOTES = (
    Quote(RESULTS, r"\| memory plan within ±10% of the measured peak \| (\d+\.\d%) of (\d+) completed runs", SOURCE,
          _within_10),
    Quote(RESULTS, r"every fp8 run among them: ([−+]\d+\.\d%) to ([−+]\d+\.\d%)\)", SOURCE, _fp8),
    Quote(RESULTS, r"\| memory plan within ±15% \| all but (\d+) \(worst ([−+]\d+\.\d%)", SOURCE, _over_15),
    Quote(RESULTS, r"\| completed runs predicted not to fit \| (\d+) \|", SOURCE,
          lambda: (str(_memory()["completed_not_fit"]),)),
    Quote(RESULTS, r"\| out-of-memory runs predicted to fit \(not tight\) \| (\d+) of (\d+) recorded", SOURCE,
          lambda: (str(_memory()["oom_fit"]), str(_memory()["oom"]))),
)


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = stale_quotes(quotes=QUOTES)
        for line in stale:
            print(f"{line}: run `python -m multirun_analysis.quoted` and commit it", file=sys.stderr)
        return 1 if stale else 0
    for line in write_quotes(QUOTES):
        print(f"rewrote: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The documentation cannot go stale: docs/knobs.md is what bench.docgen renders from the schemas, every number
README.md and docs quote from a record is what the record says (bench.docgen QUOTES), and every relative link in
README.md and docs/*.md points to a file or folder of the repository."""
from __future__ import annotations

import re
from pathlib import Path

from bench import docgen

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def test_knobs_md_is_generated_from_the_schemas():
    committed = (ROOT / "docs" / "knobs.md").read_text()
    assert docgen.render() == committed, "docs/knobs.md is stale: run `python -m bench.docgen` and commit it"


def test_relative_links_point_to_existing_paths():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = FENCE.sub("", page.read_text())
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # http(s):, mailto:, an anchor within the page
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists() or ROOT not in (path, *path.parents):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_quoted_numbers_match_their_records():
    """README.md and docs quote numbers of bench/plan/calibration.json and of a results folder's note: each is what its
    record says now (python -m bench.docgen rewrites them)."""
    assert not docgen.stale_quotes(), "\n".join(docgen.stale_quotes())


def test_the_memory_plans_quoted_accuracy_is_todays_replanning_of_the_recorded_runs():
    """docs/results.md's memory-plan numbers: every recorded GPU run re-planned by today's code (about 5 s;
    python -m multirun_analysis.quoted rewrites them)."""
    from multirun_analysis import quoted

    stale = docgen.stale_quotes(quotes=quoted.QUOTES)
    assert not stale, "\n".join(stale)


def test_a_drifted_quote_is_caught_and_rewritten():
    readme = (ROOT / "README.md").read_text()
    q = next(q for q in docgen.QUOTES if q.page == "README.md" and "calibration.json" in q.source)
    median = docgen._held_out()[0]
    drifted = readme.replace(f"median {median}, 90th percentile", "median 99.9%, 90th percentile", 1)
    assert drifted != readme
    assert docgen.stale_quotes({"README.md": drifted}, [q]) == [
        f"README.md quotes 99.9% / {' / '.join(docgen._held_out()[1:])} where bench/plan/calibration.json: error says "
        f"{' / '.join(docgen._held_out())}"]
    assert docgen._requote(q, drifted)[0] == readme  # the rewrite restores what the record says

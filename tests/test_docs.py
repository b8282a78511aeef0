"""The documentation cannot go stale: docs/knobs.md is what bench.docgen renders from the schemas,
and every relative link in README.md and docs/*.md points to a file or folder of the repository."""
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

"""docs/study.md's table is what ``python -m bench.study`` renders with today's prediction (the study's published
efficiencies beside bench's for the same runs on RTX A6000s): a change to the prediction that moves it fails here
until the page is rewritten (``python -m bench.study --write``)."""
from __future__ import annotations

from bench import study


def test_the_study_page_holds_todays_table():
    table = study.rows()
    assert len(table) == len(study.PUBLISHED)
    for r in table:
        assert all(0 < v < 1.2 for v in r["bench"].values() if v is not None), r
    assert study.block_in() == study.block(table), "docs/study.md is stale: python -m bench.study --write"

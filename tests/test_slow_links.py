"""The prediction on slow links against the runs measured there (results/2026-11-27-h100x4-slow-links: NCCL kept
off peer-to-peer, so traffic goes through host memory, on 4 x H100), each link regime held out whole: fitted on the
other regimes' runs, scored without refitting (python -m bench.calibrate --by-regime).  A probe's link is NCCL's
bus bandwidth as measured, at the step's message size on its all-reduce curve (bench/plan/predict.py measured_link)."""
from __future__ import annotations

import pytest

from bench.calibrate import by_regime, regime_table
from bench.machine.hardware import PRESETS
from bench.plan.link_terms import measured_link
from tests.conftest import REPO

SLOW = REPO / "results" / "2026-11-27-h100x4-slow-links"


@pytest.fixture(scope="module")
def scores():
    return by_regime([REPO / "results"])  # a fit per regime: once for the module


def test_peer_to_peer_off_held_out_is_predicted_within_10_percent_median(scores):
    p2p = scores["p2p_off"]
    assert p2p["runs"] >= 8 and p2p["fitted_on"] > 800
    assert p2p["error"]["median_abs"] <= 0.10, regime_table(scores)


def test_a_probed_link_is_read_on_its_curve_and_a_datasheet_link_is_fitted():
    from bench.machine.hardware import resolve
    from omegaconf import OmegaConf

    prof = OmegaConf.to_container(OmegaConf.load(SLOW / "hardware" / "h100x4_p2p_off.yaml"))
    hw = resolve({"hardware": prof})
    curve = {p["bytes"]: p["busbw_gbps"] for p in prof["probe"]["curves"]["intra_node"]["all_reduce"]}
    at_16mib = measured_link(hw, {"grad_reduce": 100 * 2**24, "collectives": 100})
    assert at_16mib["link_fitted"] == 0 and at_16mib["link_factor"] * hw.intra_node_gbps == pytest.approx(curve[2**24], rel=1e-9)
    assert measured_link(PRESETS["h100_sxm_80gb"], {"grad_reduce": 1e9, "collectives": 10}) == \
        {"link_fitted": 1.0, "link_factor": 1.0}


def test_the_docs_quote_todays_per_regime_table(scores):
    import re

    text = (REPO / "docs" / "results.md").read_text()
    quoted = re.search(r"<!-- regimes: begin -->\n(.*?)\n<!-- regimes: end -->", text, re.S).group(1)
    assert quoted == regime_table(scores), "docs/results.md's regime table is stale"


def test_a_prediction_on_a_slow_link_quotes_its_regime_held_out_error(scores):
    """On a probe profile whose link is sockets, the prediction's error is the one measured with the sockets regime
    held out of the fit (the shipped calibration's error_by_regime, as --by-regime computes it), not the NVLink runs'
    of its GPU and strategy; on a datasheet NVLink preset, none."""
    from dataclasses import replace

    from bench.machine.hardware import resolve
    from bench.plan.calibration_error import regime_error
    from bench.plan.predict import error_words, load_calibration
    from omegaconf import OmegaConf

    from tests.test_planner import replan

    prof = OmegaConf.to_container(OmegaConf.load(SLOW / "hardware" / "h100x4_sockets.yaml"))
    hw = resolve({"hardware": prof})
    plan = replan(["model=llama3_1b", "strategy=ddp", "world_size=4", "hardware=h100_sxm_80gb"])
    cal = load_calibration()
    quoted = regime_error(cal, plan, hw)
    assert quoted["regime"] == "sockets" and quoted["runs"] == scores["sockets"]["runs"]
    assert quoted["median_abs"] == pytest.approx(scores["sockets"]["error"]["median_abs"], rel=1e-6)
    assert "over the sockets link regime, held out of the fit" in error_words({"regime_error": quoted})
    assert regime_error(cal, plan, PRESETS["h100_sxm_80gb"]) is None
    assert regime_error(cal, plan, replace(PRESETS["h100_sxm_80gb"], intra_node_link="pcie"))["regime"] == "p2p_off"

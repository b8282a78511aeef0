"""The prediction on slow links against the runs measured there (results/2026-11-27-h100x4-slow-links: NCCL kept
off peer-to-peer, so traffic goes through host memory, on 4 x H100), each link regime held out whole: fitted on the
other regimes' runs, scored without refitting (python -m bench.calibrate --by-regime).  A probe's link is NCCL's
bus bandwidth as measured, at the step's message size on its curve (bench/plan/link_terms.py measured_link)."""
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


@pytest.mark.parametrize("regime", ["p2p_off", "sockets"])
def test_each_slow_regime_held_out_is_predicted_within_10_percent_median(scores, regime):
    held_out = scores[regime]
    assert held_out["runs"] >= 8 and held_out["fitted_on"] > 800
    assert held_out["error"]["median_abs"] <= 0.10, regime_table(scores)


def test_by_regime_lists_each_held_out_run_largest_error_first(scores, capsys):
    """``--by-regime --runs N``: a regime's runs, each its measured and predicted step and the error between them
    (on tokens/s), the largest first; their absolute errors' median is the table's."""
    import statistics

    from bench.calibrate import main

    rows = scores["sockets"]["per_run"]
    assert len(rows) == scores["sockets"]["runs"]
    errors = [abs(r["error"]) for r in rows]
    assert errors == sorted(errors, reverse=True)
    assert all(r["error"] == pytest.approx(r["measured_ms"] / r["predicted_ms"] - 1) for r in rows)
    assert statistics.median(errors) == pytest.approx(scores["sockets"]["error"]["median_abs"])
    assert main(["--by-regime", "--runs", "2", str(REPO / "results")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(regime_table(scores))
    assert printed.count("| 2026-") == 2 * len(scores) and f"| {rows[0]['run']} | {rows[0]['folder']} |" in printed
    with pytest.raises(SystemExit):
        main(["--runs", "2", str(REPO / "results")])
    assert "add --by-regime" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--by-regime", "--runs", "-1", str(REPO / "results")])
    assert "0 or more" in capsys.readouterr().err


def _profile(name: str):
    from bench.machine.hardware import resolve
    from omegaconf import OmegaConf

    prof = OmegaConf.to_container(OmegaConf.load(SLOW / "hardware" / name))
    intra = prof["probe"]["curves"]["intra_node"]
    curves = {c: {p["bytes"]: p["busbw_gbps"] for p in rows} for c, rows in intra.items()}
    return resolve({"hardware": prof}), curves


def test_a_probed_slow_link_is_read_on_its_three_collectives_and_nvlink_on_its_all_reduce():
    """At 16 MiB a step of 100 such messages reads: with peer-to-peer off, the median of the probe's all-reduce,
    reduce-scatter and all-gather bus bandwidths there (one link, three readings); on the NVLink probe, the
    all-reduce's alone (there the three differ by NCCL's algorithm); a datasheet figure is fitted instead."""
    import statistics

    traffic = {"grad_reduce": 100 * 2**24, "collectives": 100}
    hw, curves = _profile("h100x4_p2p_off.yaml")
    three = [curves[c][2**24] for c in ("all_reduce", "reduce_scatter", "all_gather")]
    assert len(set(three)) == 3  # the test reads a size where they differ
    slow = measured_link(hw, traffic)
    assert slow["link_fitted"] == 0
    assert slow["link_factor"] * hw.intra_node_gbps == pytest.approx(statistics.median(three))
    hw, curves = _profile("h100x4_default.yaml")
    assert measured_link(hw, traffic)["link_factor"] * hw.intra_node_gbps == pytest.approx(curves["all_reduce"][2**24])
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
    from bench.plan.predict import load_calibration
    from bench.plan.prediction_text import error_words
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


def test_a_slow_link_prediction_says_how_far_its_regimes_probes_moved(scores):
    """The link figure a slow-link prediction scales with is one probe's: the words quote the range of the distinct
    probe profiles its regime's recorded runs were planned with, read here from the profiles' files."""
    from omegaconf import OmegaConf

    from bench.plan.predict import load_calibration
    from bench.plan.prediction_text import error_words

    files = {f.read_text(): f for f in (REPO / "results").glob("*/hardware/*_sockets.yaml")}  # a copied file: once
    figures = sorted(OmegaConf.load(f)["intra_node_gbps"] for f in files.values())
    quoted = {**load_calibration()["error_by_regime"]["sockets"], "regime": "sockets"}
    assert quoted["probed_link"] == {"probes": len(figures), "min_gbps": figures[0], "max_gbps": figures[-1]}
    assert len(figures) >= 2 and (f"the {len(figures)} recorded probes of this regime measured its link at "
                                  f"{figures[0]:.3g}-{figures[-1]:.3g} GB/s") in error_words({"regime_error": quoted})
    assert scores["sockets"]["probed_link"] == quoted["probed_link"]  # today's records, as shipped


def test_a_link_regime_on_hardware_of_another_link_has_no_prediction_and_says_why(tmp_path, capsys):
    """link_regime=sockets sends NCCL's traffic through sockets (about 2.5 GB/s on the recorded H100 hosts): planned
    on an NVLink preset (450 GB/s), a prediction would be off by that ratio.  A dry run states none and why, the
    planner (which ranks by predicted speed) refuses in one line; planned with the regime's probe, both predict."""
    import json

    from bench.planner.cli import main
    from tests.conftest import run_bench

    common = ["model=llama3_1b", "link_regime=sockets", "model.global_batch=8"]
    p = run_bench(*common, "strategy=ddp", "world_size=4", "hardware=h100_sxm_80gb", "dry_run=true", run_dir=tmp_path,
                  timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "prediction: none (link_regime=sockets keeps NCCL off its own link, and hardware=h100_sxm_80gb describes " \
           "its nvlink link" in p.stdout + p.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["prediction"] is None
    assert main([*common, "hardware=h100_sxm_80gb", "nodes=1", "gpus_per_node=4", f"out={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("invalid config: link_regime='sockets': keeps NCCL off") and "\n" not in err
    probed = ["--config-dir", str(SLOW), "hardware=h100x4_sockets"]
    assert main([*probed, *common, "strategy=ddp", "top=1", f"out={tmp_path / 'p'}"]) == 0
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["rows"][0]["tokens_per_s"] > 0


def test_the_slow_link_table_prints_every_run_and_the_preset_it_refuses(capsys):
    """benchmarks/slow_links_table.py over a recorded folder: a row per completed run, and the GPU preset's column
    says "refused" on a slow link (the preset describes NVLink) and predicts the NVLink runs (it raised there when
    the prediction began refusing a regime on another link's hardware)."""
    import json

    from benchmarks.slow_links_table import main

    main(str(SLOW / "runs.json"))
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| p2p_off ", "| sockets ", "| default "))]
    completed = [m for m in json.loads((SLOW / "runs.json").read_text()) if m.get("status") == "completed"]
    runs = [r for r in rows if len(r) == 13]
    assert len(runs) == len(completed), out
    for r in runs:
        regime, preset = r[0].strip("| "), r[11]
        assert (preset == "refused") == (regime != "default"), r


def test_the_300m_runs_spend_longer_outside_compute_than_llama_1b_on_the_same_links(capsys):
    """benchmarks/run_errors.py --breakdown over the folder's 4-GPU slow-link runs (shipped fit): what is not compute
    in the 300m model's measured step is 1.1-1.4x the prediction's communication and host time, Llama 3.2 1B's
    0.93-1.05x, on the same host and probe profile (docs/results.md quotes both ranges)."""
    from benchmarks.run_errors import main

    ratios: dict[str, list[float]] = {}
    for regime in ("sockets", "p2p_off"):
        main([f"link_regime={regime}", "world_size=4"], [str(SLOW)], breakdown=True)
        for line in capsys.readouterr().out.splitlines():
            cells = [c.strip() for c in line.strip("| ").split(" | ")]
            if len(cells) == 8 and cells[0] == SLOW.name:
                ratios.setdefault(cells[1].split()[0], []).append(float(cells[7]))
    assert len(ratios["300m"]) == 6 and len(ratios["llama3_1b"]) == 8, ratios
    # the quoted ranges, to the refit's noise: every 300m run above every Llama 1B run of the same links
    assert 1.05 <= min(ratios["300m"]) and max(ratios["300m"]) <= 1.45, ratios
    assert min(ratios["300m"]) > max(ratios["llama3_1b"]), ratios
    assert 0.9 <= min(ratios["llama3_1b"]) and max(ratios["llama3_1b"]) <= 1.1, ratios

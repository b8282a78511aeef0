"""The shipped calibration (bench/plan/calibration.json) is what ``python -m bench.calibrate results/`` computes from the
recorded runs with today's code: its fitted constants, host factors, every error summary and the runs it used.  A
change to the prediction, the plans it re-reads or results/ that moves any of them fails here until the
calibration is rerun and committed (the docs quote its numbers)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import REPO

REL = 1e-6  # float noise of the fit (summation order, BLAS), far below any change worth a recalibration
# the error summaries are fractions (predicted / measured - 1) whose medians can sit near 0, where REL is a few 1e-9:
# below the noise of one numpy / scipy release against another (a median of -0.0034 moved by 4e-9); 1e-7 is a
# hundred-thousandth of a percentage point. Constants and host factors (scales down to 1e-9) keep REL alone
ERROR_ABS = 1e-7
EXACT_SCALE = ("/constants", "/host_factors")


def differences(shipped, fresh, path: str = "") -> list[str]:
    """Where two JSON values differ: keys, lengths, strings and integers exactly, floats beyond REL."""
    if isinstance(shipped, dict) and isinstance(fresh, dict):
        out = [f"{path}/{k}: only in {'the shipped file' if k in shipped else 'the fresh fit'}"
               for k in sorted(set(shipped) ^ set(fresh))]
        return out + [d for k in shipped if k in fresh for d in differences(shipped[k], fresh[k], f"{path}/{k}")]
    if isinstance(shipped, list) and isinstance(fresh, list):
        if len(shipped) != len(fresh):
            return [f"{path}: {len(shipped)} items shipped, {len(fresh)} fitted"]
        return [d for i, (a, b) in enumerate(zip(shipped, fresh)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(shipped, float) or isinstance(fresh, float):
        floor = 1e-12 if path.startswith(EXACT_SCALE) else ERROR_ABS
        same = isinstance(fresh, (int, float)) and math.isclose(shipped, fresh, rel_tol=REL, abs_tol=floor)
        return [] if same else [f"{path}: shipped {shipped!r}, fitted {fresh!r}"]
    return [] if shipped == fresh else [f"{path}: shipped {shipped!r}, fitted {fresh!r}"]


def test_differences_sees_a_moved_constant_a_new_key_and_a_count():
    shipped = {"constants": {"e_max": 0.75}, "error": {"runs": 891}}
    assert differences(shipped, json.loads(json.dumps(shipped))) == []
    assert differences(shipped, {"constants": {"e_max": 0.75 * (1 + 1e-9)}, "error": {"runs": 891}}) == []
    # an error median near 0 moved by float noise is the same; a constant moved by 1%, however small, is not
    assert differences({"error": {"median": -0.0033728850}}, {"error": {"median": -0.0033728894}}) == []
    assert differences({"constants": {"per_adam_param": 8.66e-10}}, {"constants": {"per_adam_param": 8.76e-10}}) == [
        "/constants/per_adam_param: shipped 8.66e-10, fitted 8.76e-10"]
    assert differences(shipped, {"constants": {"e_max": 0.7501}, "error": {"runs": 890}, "x": 1}) == [
        "/x: only in the fresh fit", "/constants/e_max: shipped 0.75, fitted 0.7501",
        "/error/runs: shipped 891, fitted 890"]


@pytest.mark.slow
def test_the_shipped_calibration_is_what_calibrate_computes_from_results(tmp_path):
    out = tmp_path / "calibration.json"
    p = subprocess.run([sys.executable, "-m", "bench.calibrate", "results/", "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    shipped = json.loads((REPO / "bench" / "plan" / "calibration.json").read_text())
    diff = differences(shipped, json.loads(out.read_text()))
    assert not diff, ("bench/plan/calibration.json is not what `python -m bench.calibrate results/` computes now; rerun "
                      "it if the change is meant:\n" + "\n".join(diff[:40]))


def test_the_frozen_command_scores_the_frozen_folders_and_leaves_the_calibration_as_it_was():
    """``--frozen`` re-scores the folders the fit kept out with the shipped constants: it prints the score the
    fit recorded for them, and bench/plan/calibration.json is byte for byte what it was."""
    path = REPO / "bench" / "plan" / "calibration.json"
    before = path.read_bytes()
    cal = json.loads(before)
    folders = cal["frozen"]["folders"]
    assert folders and not set(folders) & set(cal["fitted_on"]["folders"])
    p = subprocess.run([sys.executable, "-m", "bench.calibrate", "--frozen", *[f"results/{f}" for f in folders]],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert path.read_bytes() == before
    e = cal["frozen"]["error"]
    row = next(line for line in p.stdout.splitlines() if "these folders (frozen)" in line).split()[-5:]
    assert row == [str(e["runs"]), f"{100 * e['median_abs']:.1f}%", f"{100 * e['median_abs_step_ge_100ms']:.1f}%",
                   f"{100 * e['p90_abs']:.1f}%", f"{e['winner_agree']}/{e['winner_groups']}"], p.stdout


def test_the_frozen_command_refuses_a_folder_the_calibration_was_fitted_on(capsys):
    from bench.calibrate import main

    fitted = json.loads((REPO / "bench" / "plan" / "calibration.json").read_text())["fitted_on"]["folders"][0]
    with pytest.raises(SystemExit, match=f"{fitted} was fitted by .*not a frozen evaluation"):
        main(["--frozen", str(REPO / "results" / fitted)])


def test_docs_quote_the_shipped_calibration():
    """docs/results.md's throughput-error block is what the shipped calibration renders (python -m bench.calibrate
    results/ rewrites it)."""
    from bench.plan.calibration_error import docs_block, docs_block_in

    shipped = json.loads((REPO / "bench" / "plan" / "calibration.json").read_text())
    assert docs_block_in() == docs_block(shipped), "rerun python -m bench.calibrate results/ (it rewrites the block)"

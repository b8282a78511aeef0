"""Prediction against measurement (multirun_analysis/prediction.py): recorded GPU runs re-planned from their
configurations with the current code, the prediction.csv columns, and the four numbers."""
from __future__ import annotations

import json
import subprocess
import sys

from multirun_analysis.prediction import COLUMNS, accuracy, prediction_table
from tests.conftest import REPO

LLAMA = REPO / "results" / "2026-11-25-h100-llama-plan-profiles"


def test_every_completed_recorded_run_is_replanned():
    t = prediction_table([LLAMA])
    assert list(t.columns[:len(COLUMNS)]) == COLUMNS
    done = t[t["status"] == "completed"]
    assert len(done) >= 10 and done["note"].isna().all(), done["note"].dropna().tolist()
    assert done["predicted_peak_gib"].gt(0).all() and done["measured_peak_gib"].gt(0).all()
    assert (done["predicted_fits"] == True).all()  # noqa: E712  (each ran on an 80 GB H100)
    acc = accuracy(t)
    assert acc["memory_runs"] == len(done) and acc["completed_predicted_oom"] == 0


def test_an_out_of_memory_record_is_counted_against_the_verdict(tmp_path):
    """A recorded OOM predicted to fit (and not tight) counts as a wrong verdict; predicted not to fit does not."""
    runs = json.loads((LLAMA / "runs.json").read_text())
    big = max((r for r in runs if r["status"] == "completed"), key=lambda r: r["memory"]["max_allocated_mb"])
    oom_fits = dict(big, status="oom", error="CUDA out of memory")
    oom_huge = json.loads(json.dumps(oom_fits))
    oom_huge["config"]["model"]["global_batch"] *= 64  # the same run with 64x the batch cannot fit on 80 GB
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "runs.json").write_text(json.dumps([oom_fits, oom_huge]))
    t = prediction_table([tmp_path])
    assert list(t["status"]) == ["oom", "oom"] and list(t["predicted_fits"]) == [True, False]
    acc = accuracy(t)
    assert acc["oom_runs"] == 2 and acc["oom_predicted_to_fit"] == int(not t["predicted_tight"].iloc[0])


def test_the_command_prints_the_four_numbers_and_writes_the_table(tmp_path):
    p = subprocess.run([sys.executable, "-m", "multirun_analysis.prediction", str(LLAMA), "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    for first in ("memory plan:", "fit verdict:", "throughput:", "winner:"):
        assert any(line.startswith(first) for line in p.stdout.splitlines()), p.stdout
    assert (tmp_path / "prediction.csv").is_file()


def test_a_dry_run_sweep_for_a_node_one_does_not_have_is_ranked_as_predicted(tmp_path):
    """On this CPU machine: plan Llama-3 8B on 8 H100s under several layouts, then the analysis ranks the
    layouts that fit by predicted tokens/s (said to be predicted, with the measured error) and lists those that
    do not fit after them."""
    from tests.conftest import run_bench

    sweep = tmp_path / "dry"
    p = run_bench("model=llama3_8b", "world_size=8", "dry_run=true", "hardware=h100_sxm_80gb",
                  "+experiment/arm=fsdp,ddp,tp", run_dir=sweep, multirun=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    plans = json.loads((sweep / "plans.json").read_text())
    assert len(plans) == 3 and all(r["prediction"]["tokens_per_s"] > 0 for r in plans)
    a = subprocess.run([sys.executable, "-m", "multirun_analysis", str(sweep), "--no-plots"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert a.returncode == 0, a.stderr[-2000:]
    rows = [line.split(" | ") for line in a.stdout.splitlines() if line.startswith("| llama3_8b")]
    assert "Predicted ranking (dry run: planned, nothing measured)" in a.stdout and "median" in a.stdout
    fits = [r[4] for r in rows]
    assert fits[-1] == "no" and "no" not in fits[:2], rows  # DDP's replicated 8B states do not fit on 80 GB
    assert (sweep / "analysis" / "report.md").read_text().count("| llama3_8b |") == 3


def test_a_dry_run_prints_the_prediction_beside_its_error(tmp_path):
    from tests.conftest import run_bench

    p = run_bench("model=llama3_1b", "strategy=fsdp", "world_size=2", "dry_run=true", "hardware=a100_80gb",
                  run_dir=tmp_path / "r", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in (p.stdout + p.stderr).splitlines() if "prediction:" in x)
    assert "tokens/s" in line and "measured error of such predictions: median" in line
    plan = json.loads((tmp_path / "r" / "plan.json").read_text())
    assert plan["prediction"]["step_time_s"] > 0

"""The throughput prediction (bench/plan/predict.py) and its calibration (bench/calibrate.py), on CPU: every strategy
is predicted for a GPU preset from a dry-run plan, the breakdown adds up, the predictions move the way the
hardware says they must, and the calibration runs on a copy of two recorded results folders."""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from hydra import compose, initialize_config_dir

from bench.calibrate import calibrate
from bench.run.config import register_configs, validate
from bench.machine.hardware import PRESETS
from bench.plan.predict import MEASURED_OVER_DATASHEET, load_calibration, predict
from bench.plan.prediction_text import prediction_line
from tests.conftest import REPO

register_configs()

EVERY_STRATEGY = {
    "single": ["strategy=single", "world_size=1"], "ddp": ["strategy=ddp"], "fsdp": ["strategy=fsdp"],
    "fsdp_tp": ["strategy=fsdp", "strategy.tp=2"], "zero0": ["strategy=zero", "zero_stage=0"],
    "zero3": ["strategy=zero", "zero_stage=3"], "zero2_offload": ["strategy=zero", "zero_stage=2",
                                                                  "strategy.offload_optimizer=cpu"],
    "megatron": ["strategy=megatron"], "megatron_tp2_pp2": ["strategy=megatron", "strategy.tp=2", "strategy.pp=2"],
    "megatron_graphs": ["strategy=megatron", "strategy.cuda_graph=true", "warmup_steps=5"],
    "tp": ["strategy=tp"], "tp_torch": ["strategy=tp", "strategy.impl=torch", "strategy.tp=8"],
    "pp": ["strategy=pp", "strategy.pp=4", "model.global_batch=32"],
    "pp_torch": ["strategy=pp", "strategy.impl=torch", "strategy.pp=2", "microbatches=2", "model.tie_embeddings=false"],
}


def plan_for(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=["dry_run=true", *overrides]), gpus=0)


def breakdown_total(p: dict) -> float:
    return sum(p["breakdown"][k] for k in ("compute_s", "exposed_comm_s", "bubble_s", "host_s"))


@pytest.mark.parametrize("name", list(EVERY_STRATEGY))
def test_every_strategy_is_predicted_for_a_preset(name):
    plan = plan_for("model=llama3_1b", "world_size=8", "hardware=h100_sxm_80gb", *EVERY_STRATEGY[name])
    p = predict(plan)
    assert p["tokens_per_s"] > 0 and p["step_time_s"] > 0
    assert set(p["breakdown"]) == {"compute_s", "exposed_comm_s", "bubble_s", "host_s"}
    assert all(v >= 0 for v in p["breakdown"].values()), p["breakdown"]
    assert breakdown_total(p) == pytest.approx(p["step_time_s"], rel=1e-9)
    tokens = plan.model.global_batch * plan.model.seq_len
    assert p["tokens_per_s"] == pytest.approx(tokens / p["step_time_s"])
    assert p["error"] == load_calibration()["error"]  # the shipped calibration's measured error
    if plan.world_size > 1 and plan.dp_size * plan.tp * plan.pp > 1 and name != "single":
        assert p["breakdown"]["exposed_comm_s"] > 0  # several GPUs move something
    if plan.pp > 1:
        assert p["breakdown"]["bubble_s"] > 0


def test_the_shipped_calibration_states_its_error():
    err = load_calibration()["error"]
    for key in ("median_abs", "median_abs_step_ge_100ms", "p90_abs", "winner_agreement", "runs", "method"):
        assert key in err
    assert "leave-one-results-folder-out" in err["method"]


@pytest.mark.parametrize("model", ["gpt2", "300m", "llama3_1b"])
def test_more_ddp_gpus_at_a_fixed_per_rank_batch_never_lower_total_throughput(model):
    per_rank = {"gpt2": 32, "300m": 8, "llama3_1b": 4}[model]
    rates = [predict(plan_for(f"model={model}", "strategy=ddp", f"world_size={n}",
                              f"model.global_batch={per_rank * n}", "hardware=h100_sxm_80gb"))["tokens_per_s"]
             for n in (1, 2, 4, 8)]
    assert rates == sorted(rates), rates


def test_pcie_exposes_more_communication_than_nvlink():
    layout = ["model=300m", "strategy=ddp", "world_size=4", "model.global_batch=16"]
    pcie = predict(plan_for(*layout, "hardware=rtx_a6000"))["breakdown"]["exposed_comm_s"]
    nvlink = predict(plan_for(*layout, "hardware=h100_sxm_80gb"))["breakdown"]["exposed_comm_s"]
    assert pcie > nvlink > 0


def test_a_named_host_uses_its_factor_and_an_unknown_one_the_median():
    plan = plan_for("model=gpt2", "strategy=zero", "zero_stage=3", "world_size=1", "hardware=h100_sxm_80gb")
    cal = load_calibration()
    cal = {**cal, "host_factors": {"slow/8 CPUs": 2.0}}
    slow, median = predict(plan, host="slow/8 CPUs", calibration=cal), predict(plan, host="other", calibration=cal)
    assert median["step_time_s"] == predict(plan, calibration=cal)["step_time_s"]
    assert slow["breakdown"]["host_s"] > median["breakdown"]["host_s"]


def test_calibrate_on_two_results_folders_writes_constants_and_error(tmp_path, capsys):
    for name in ("2026-11-22-h200x2-foundation", "2026-11-22-h200x2-sharding"):
        (tmp_path / "results" / name).mkdir(parents=True)
        shutil.copy(REPO / "results" / name / "runs.json", tmp_path / "results" / name / "runs.json")
    out = tmp_path / "calibration.json"
    calibrate([tmp_path / "results"], out)
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert "roofline, nothing fitted" in printed and "model, held out" in printed
    assert doc["roofline_error"]["runs"] == doc["error"]["runs"]
    by_gpu = {gpu: sum(by["*"]["runs"] for by in per.values()) for gpu, per in doc["error_by_case"].items()}
    assert by_gpu == {"h200_141gb": doc["error"]["runs"]}  # both folders: one node of H200s
    strategies = {k for k in doc["error_by_case"]["h200_141gb"]["1"] if k != "*"}
    assert sum(doc["error_by_case"]["h200_141gb"]["1"][k]["runs"] for k in strategies) == doc["error"]["runs"]
    assert set(doc["constants"]) == set(load_calibration()["constants"])
    assert all(v > 0 for v in doc["constants"].values())
    err = doc["error"]
    assert err["runs"] == doc["fitted_on"]["runs"] > 0 and "leave-one-results-folder-out over 2" in err["method"]
    assert 0 <= err["median_abs"] <= err["p90_abs"]
    assert set(doc["per_folder"]) == {"2026-11-22-h200x2-foundation", "2026-11-22-h200x2-sharding"}
    plan = plan_for("model=300m", "strategy=single", "world_size=1", "hardware=h200_141gb")
    assert predict(plan, calibration=doc)["error"] == err



def test_a_frozen_folder_stays_out_of_every_refit_until_it_is_unfrozen(tmp_path):
    """--freeze keeps a folder out of the fit and scores it with the fit's constants; a refit over the same file
    keeps it out; --unfreeze folds it back in, where it counts the same runs."""
    a, b = "2026-11-22-h200x2-foundation", "2026-11-22-h200x2-sharding"
    for name in (a, b):
        (tmp_path / "results" / name).mkdir(parents=True)
        shutil.copy(REPO / "results" / name / "runs.json", tmp_path / "results" / name / "runs.json")
    out = tmp_path / "calibration.json"
    first = calibrate([tmp_path / "results"], out, quiet=True, freeze=(b,))
    assert first["fitted_on"]["folders"] == [a] and b in first["frozen"]["folders"]
    assert first["frozen"]["per_folder"][b]["runs"] == first["frozen"]["error"]["runs"] > 0
    again = calibrate([tmp_path / "results"], out, quiet=True)
    assert again["fitted_on"] == first["fitted_on"] and again["constants"] == first["constants"]
    assert again["frozen"] == first["frozen"]
    folded = calibrate([tmp_path / "results"], out, quiet=True, unfreeze=(b,))
    assert folded["fitted_on"]["folders"] == [a, b] and b not in folded["frozen"]["folders"]
    assert folded["per_folder"][b]["runs"] == first["frozen"]["error"]["runs"]


def test_a_probe_at_the_typical_measured_share_of_the_datasheet_peak_predicts_what_the_preset_does():
    """A datasheet preset's peaks are taken at the share the recorded runs measured; a probe's profile holds
    measured peaks, used as they are: the same GPU probed at that share predicts the same step, and a probe that
    measured the full datasheet peak predicts less compute.  (Its link is NCCL's bus bandwidth as measured, not a
    datasheet figure: tests/test_slow_links.py.)"""
    plan = plan_for("model=llama3_1b", "strategy=fsdp", "world_size=4", "hardware=h100_sxm_80gb")
    preset = PRESETS["h100_sxm_80gb"]

    def probed(share: float):
        peaks = {k: v * share if v else v for k, v in preset.peak_tflops.items()}
        return dataclasses.replace(preset, name="probed", source="probe", peak_tflops=peaks)

    typical = predict(plan, hardware=probed(MEASURED_OVER_DATASHEET))
    assert typical["breakdown"]["compute_s"] == pytest.approx(predict(plan)["breakdown"]["compute_s"], rel=1e-12)
    assert predict(plan, hardware=probed(1.0))["breakdown"]["compute_s"] < typical["breakdown"]["compute_s"]

def test_fp8_pays_for_its_casts_per_token_and_once_under_full_recompute():
    """torchao casts each converted Linear's input and output gradient to float8: memory-bound work that the
    float8 matmuls' speed-up does not include (bench/plan/predict.py fp8_cast; fitted on the recorded fp8 runs).
    fp8 runs compiled, and Inductor fuses the recomputed forward's casts into the kernels that recompute their
    inputs (one H200's traces: +4.8 ms of Triton kernels where the casts were counted at 82 ms,
    results/2026-12-04-h200x1-long-sequence): full recompute adds none."""
    from bench.plan.predict import terms

    base = ("model=llama3_1b", "world_size=1", "strategy=single", "hardware=h100_sxm_80gb", "compile=true")
    bf16, fp8 = terms(plan_for(*base, "precision=bf16")), terms(plan_for(*base, "precision=fp8"))
    full = terms(plan_for(*base, "precision=fp8", "recompute=full"))
    half = terms(plan_for(*base, "precision=fp8", "model.global_batch=4"))
    assert bf16["fp8_cast_s"] == 0.0 < fp8["fp8_cast_s"]
    assert full["fp8_cast_s"] == pytest.approx(fp8["fp8_cast_s"])
    assert half["fp8_cast_s"] == pytest.approx(fp8["fp8_cast_s"] / 2)
    assert load_calibration()["constants"]["fp8_cast"] > 1  # the casts cost more than one pass over their bytes


def test_fsdp2_float8_all_gather_pays_for_its_weight_casts_as_an_h200_traced_them():
    """Before each float8 all-gather torchao casts the rank's fp32 shard of every converted weight in eager ops
    (bench/strategies/fsdp.py ``_weight_casts``): on one H200 an 8B-wide block's resharded unit ran 14 float8 copies a
    layer (7 Linear layers, gathered for forward and again for backward) and the casts' kernels took 2.64 ms a
    layer (results/2026-12-02-h200x1-fp8-kernels).  The term counts their bytes at the HBM datasheet rate, as the
    optimizer's: below the traced time, at more than half of it.  Sharded over 4 ranks, a quarter."""
    from bench.plan.predict import terms
    from bench.strategies.fsdp import _weight_casts

    record = REPO / "results/2026-12-02-h200x1-fp8-kernels/kernels_per_layer_fp8.json"
    rows = json.loads(record.read_text())
    eager = [r for r in rows if any(k in r["kernel"] for k in ("MulFunctor<float>", "launch_clamp_scalar",
                                                                  "float8_copy_kernel"))]
    f8_copies = next(r["launches_per_layer"] for r in eager if "float8_copy_kernel" in r["kernel"])
    traced_ms = sum(r["ms_per_layer"] for r in eager)
    base = ("model=llama3_8b", "model.n_layers=12", "model.global_batch=4", "strategy=fsdp", "precision=fp8",
            "compile=true", "hardware=h200_141gb", "strategy.blocks_per_unit=1", "recompute=none")
    assert f8_copies == pytest.approx(7 * 2, abs=0.2)  # 7 converted Linear layers, two gathers
    casts = {k: _weight_casts(plan_for(*base, *extra)) for k, extra in {
        "one": ("world_size=1",), "four": ("world_size=4", "model.global_batch=16"),
        "no_amax": ("world_size=1", "strategy.fp8_precompute_scale=false"),  # the amax read: once a step
        "kept": ("world_size=1", "strategy.fp8_precompute_scale=false", "strategy.reshard_after_forward=false"),
        "bf16": ("world_size=1", "precision=bf16"), "bf16_gather": ("world_size=1", "strategy.fp8_all_gather=false"),
    }.items()}
    per_layer_ms = casts["no_amax"] / 12 / (PRESETS["h200_141gb"].hbm_gbps * 1e9) * 1e3
    assert 0.5 * traced_ms < per_layer_ms < traced_ms, (per_layer_ms, traced_ms)
    assert casts["four"] == pytest.approx(casts["one"] / 4) and casts["one"] > casts["no_amax"]
    assert casts["bf16"] == casts["bf16_gather"] == 0.0
    # not resharded, each block is gathered once; resharded, twice but the last unit (one block) once
    assert casts["kept"] * (2 * 12 - 1) / 12 == pytest.approx(casts["no_amax"])
    assert terms(plan_for(*base, "world_size=1"))["device_bytes_s"] > 0


def test_the_float8_all_gathers_weight_casts_cost_the_host_what_a_fake_rank_measured():
    """The float8 all-gather's weight casts run on the host before each gather (bench/strategies/fsdp.py
    ``FLOAT8_CAST_HOOKS``).  Rank 0 of Llama 3.2 1B, FSDP2 TP=2 x DP=2 in fp8, its collectives faked
    (benchmarks/fake_ranks.py, results/2026-12-06-h100x1-fake-ranks, calls 4-5 on one H100 host): its host's own
    work a step with the float8 all-gather (the median of three processes) less without it is the model's difference
    in host work, at that host's factor (16 CPUs), within a quarter; no lockstep (the fake rank waits for no peer)."""
    from bench.plan.predict import host_time, terms

    import statistics

    folder = REPO / "results/2026-12-06-h100x1-fake-ranks"

    def work(name: str) -> float:
        return json.loads((folder / name).read_text())["host_work_ms_median"]

    gathered = [work(f) for f in ("call4/tp2_fp8.json", "call5/tp2_fp8_r2.json", "call5/tp2_fp8_r3.json")]
    measured = statistics.median(gathered) - work("call5/tp2_fp8_noag.json")
    cal = load_calibration()
    base = ("model=llama3_1b", "strategy=fsdp", "strategy.micro_batch_size=4", "strategy.reshard_after_forward=false",
            "compile=true", "model.global_batch=8", "world_size=4", "strategy.tp=2", "precision=fp8",
            "hardware=h100_sxm_80gb")

    def host_ms(*extra: str) -> float:
        t = {**terms(plan_for(*base, *extra)), "host_lockstep": 0.0, "host_factor": cal["host_factors"]["vm/16 CPUs"]}
        return 1e3 * float(host_time(t, cal["constants"]))

    predicted = host_ms() - host_ms("strategy.fp8_all_gather=false")
    assert predicted == pytest.approx(measured, rel=0.25), (predicted, measured, gathered)


def test_ranks_in_lockstep_pay_for_the_slowest_host_only_where_hooks_meet_at_collectives():
    """Several ranks with per-layer host hooks (FSDP2, ZeRO-3's gathers) wait for the slowest rank at every collective;
    one rank, or ranks with no host hooks (DDP's C++ reducer), do not; ZeRO-1/2's hooks meet only where a bucket is
    reduced (300m: one bucket of DeepSpeed's 5e8 elements), ZeRO-2's every micro-batch (bench/plan/predict.py,
    ``lockstep``)."""
    from bench.plan.predict import terms

    base = ("model=300m", "hardware=h100_sxm_80gb")
    assert terms(plan_for(*base, "strategy=fsdp", "world_size=2"))["host_lockstep"] == 1.0
    assert terms(plan_for(*base, "strategy=fsdp", "world_size=1"))["host_lockstep"] == 0.0
    assert terms(plan_for(*base, "strategy=ddp", "world_size=2"))["host_lockstep"] == 0.0
    zero = ("strategy=zero", "world_size=2", "model.global_batch=16", "strategy.micro_batch_size=2")  # 4 micro-batches
    assert terms(plan_for(*base, *zero, "zero_stage=3"))["host_lockstep"] == 1.0
    layer_passes = 24 * 4
    assert terms(plan_for(*base, *zero, "zero_stage=1"))["host_lockstep"] == pytest.approx(2 / layer_passes)
    assert terms(plan_for(*base, *zero, "zero_stage=2"))["host_lockstep"] == pytest.approx((4 + 1) / layer_passes)
    assert 0 < load_calibration()["constants"]["lockstep"] < 1


@pytest.mark.parametrize("hardware,world,case", [("h200_141gb", 8, "h200_141gb / 1 node / fsdp"),
                                                 ("h100_sxm_80gb", 8, "h100_sxm_80gb / 1 node / fsdp")])
def test_a_prediction_quotes_the_error_measured_on_its_own_case(hardware, world, case):
    """The shipped calibration's held-out error of recorded runs of this GPU, node count and strategy."""
    pred = predict(plan_for("model=300m", "strategy=fsdp", f"world_size={world}", f"hardware={hardware}"))
    gpu, nodes, strategy = case.split(" / ")
    own = load_calibration()["error_by_case"][gpu][nodes.split()[0]][strategy]
    line = prediction_line(pred)
    assert f"measured error on {own['runs']} recorded {case} runs: median {100 * own['median_abs']:.0f}%" in line
    assert "uncalibrated" not in line


def test_a_prediction_for_two_a100_nodes_says_it_is_uncalibrated_and_what_still_holds():
    plan = plan_for("model=llama3_1b", "strategy=ddp", "world_size=16", "model.global_batch=16", "hardware=a100_80gb")
    pred = predict(plan)
    line = prediction_line(pred)
    assert "uncalibrated for a100_80gb / 2 nodes: no recorded run" in line
    assert "h200_141gb / 1 node" in line  # where the error it cannot beat was measured
    overall = load_calibration()["error"]
    assert f"expect errors beyond the measured median {100 * overall['median_abs']:.0f}%" in line
    assert 0 < pred["tokens_per_s"] <= pred["bound_tokens_per_s"]
    assert f"at most {pred['bound_tokens_per_s']:,.0f} tokens/s" in line


def test_a_prediction_quotes_the_recorded_runs_that_share_its_layout_features():
    """fp8 under torch TP: the runs recorded with both (counted here from the raw records, not the calibration) are
    quoted with which way they went; a bf16 DDP plan has none of the features and quotes no such runs."""
    recorded = [m for f in sorted((REPO / "results").glob("*/runs.json")) for m in json.loads(f.read_text())
                if m.get("status") == "completed" and (m.get("config") or {}).get("precision") == "fp8"
                and ((m.get("layout") or {}).get("tp") or 1) > 1]
    assert len(recorded) >= 2
    plan = plan_for("model=llama3_1b", "strategy=fsdp", "strategy.tp=2", "world_size=4", "precision=fp8",
                    "compile=true", "hardware=h100_sxm_80gb")
    e = predict(plan)["layout_error"]
    assert e["features"] == "fp8 & tp > 1" and e["runs"] == len(recorded)
    assert f"on the {len(recorded)} recorded runs with fp8 & tp > 1: median" in prediction_line(predict(plan))
    plain = predict(plan_for("model=llama3_1b", "strategy=ddp", "world_size=4", "hardware=h100_sxm_80gb"))
    assert plain["layout_error"] is None and "recorded runs with" not in prediction_line(plain)

"""The planner takes what ``python -m bench`` takes: every model preset, every Hugging Face config in tests/data,
your own config dir (a probe's profile), ``--help``; its #1 is what ``python -m bench ... dry_run=true`` plans for
that command (an independent re-plan through Hydra, not the planner's bookkeeping); one row per distinct setting,
with what tells rows apart in the table; and a knob the memory plan counts is searched where nothing fits
without it."""
from __future__ import annotations

import json
import shutil

import pytest
from hydra import compose, initialize_config_dir

from bench.run.config import register_configs, validate
from bench.plan.memory_model import memory_plan
from bench.planner.cli import main, plan
from bench.planner.evaluate import verdict_of
from bench.planner.job import parse
from bench.plan.predict import predict
from bench.plan.prediction_text import prediction_line
from tests.conftest import REPO

register_configs()

HF = sorted(p.name for p in (REPO / "tests" / "data" / "hf").iterdir() if p.is_dir())
PRESETS = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml") if p.stem != "hf")
PROFILE = REPO / "results" / "2026-11-27-h100x4-edge" / "hardware" / "h100x4_probe.yaml"
SLOW = REPO / "results" / "2026-11-27-h100x4-slow-links"  # its hardware/: the probe profiles of each link regime
HF_QUESTION = ["model=hf", "model.hf_config=tests/data/hf/llama-3.2-1b", "hardware=h100_sxm_80gb", "nodes=1",
               "gpus_per_node=4", "model.seq_len=2048", "tokens_per_step=32768", "train_tokens=10B"]


def replan(overrides: list[str], config_dir: str | None = None):
    """A row's command as ``python -m bench [--config-dir D] ... dry_run=true`` plans it."""
    extra = [f"hydra.searchpath=[file://{config_dir}]"] if config_dir else []
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*extra, *overrides, "dry_run=true"])
    p = validate(cfg, explicit=[o.split("=", 1)[0] for o in overrides])
    p.memory = memory_plan(p)
    return p


def assert_first_row_replans(rows: list[dict], config_dir: str | None = None) -> None:
    top = rows[0]
    p = replan(top["overrides"], config_dir)
    assert verdict_of(p.memory) == top["verdict"] and round(p.memory["needed_mb"] / 1024, 1) == top["needed_gib"]
    assert round(predict(p)["tokens_per_s"]) == top["tokens_per_s"], top["command"]


def test_a_hugging_face_config_is_planned_as_bench_plans_its_first_row(monkeypatch):
    monkeypatch.chdir(REPO)  # model.hf_config is a path relative to where the user runs
    head, rows = plan(parse(HF_QUESTION))
    assert head["job"]["model"] == "llama-3.2-1b" and head["job"]["tokens_per_step"] == 32768
    assert 1.2e9 < head["job"]["parameters"] < 1.3e9
    assert rows[0]["verdict"] == "fits" and rows[0]["days"] > 0
    assert_first_row_replans(rows)


@pytest.mark.parametrize("model", [*(f"hf:{h}" for h in HF), *PRESETS])
def test_every_model_preset_and_hugging_face_config_plans_or_refuses_in_one_line(model, capsys, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.chdir(REPO)
    pick = ["model=hf", f"model.hf_config=tests/data/hf/{model[3:]}"] if model.startswith("hf:") else [f"model={model}"]
    rc = main([*pick, "hardware=h100_sxm_80gb", "strategy=fsdp", "model.seq_len=1024", "top=3", f"out={tmp_path}"])
    out = capsys.readouterr()
    if rc == 2:  # refused (a mixture of experts, say): one line, no traceback
        assert len(out.err.strip().splitlines()) == 1 and "Traceback" not in out.err, out.err
        return
    assert rc in (0, 3), out.err
    assert "layouts ranked" in out.out and (tmp_path / "plan.json").is_file()


def test_a_probe_profile_in_your_config_dir_is_planned_and_its_commands_name_the_dir(tmp_path, capsys):
    (tmp_path / "hardware").mkdir()
    shutil.copy(PROFILE, tmp_path / "hardware" / "mynode.yaml")
    argv = ["--config-dir", str(tmp_path), "hardware=mynode", "model=llama3_1b", "strategy=ddp", "top=2",
            f"out={tmp_path / 'plan'}"]
    assert main(argv) == 0
    head, rows = plan(parse(argv))
    assert head["job"]["hardware"] == "h100x4_probe" and head["job"]["world_size"] == 4  # the profile's node
    assert rows[0]["command"].startswith(f"python -m bench --config-dir {tmp_path} ")
    assert_first_row_replans(rows, str(tmp_path))
    from bench.planner.measure import sweep_command  # measure_top's sweep searches the same dir

    cmd = sweep_command(["row1"], tmp_path / "conf", [], [], tmp_path / "m", parse(argv).config_dirs)
    assert f"file://{tmp_path}]" in next(a for a in cmd if a.startswith("hydra.searchpath="))
    assert main(["--config-dir", str(tmp_path / "missing"), "hardware=mynode"]) == 2
    assert "--config-dir" in capsys.readouterr().err


def test_help_and_unknown_flags(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--config-dir" in out and "tokens_per_step" in out and "model.hf_config" in out
    assert main(["--frobnicate", "model=tiny"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--frobnicate" in err


def test_a_counted_knob_is_searched_where_nothing_fits_without_it_and_rows_are_distinct():
    """Llama-3 8B on 8 x A100 40GB at 4096 x 248: FSDP2 fits only with sync_every_microbatch (its unsharded
    gradients between micro-batches otherwise); the planner must find it, as planning that one strategy with
    the knob set does."""
    q = ["model=llama3_8b", "hardware=a100_40gb", "nodes=1", "gpus_per_node=8", "model.seq_len=4096",
         "tokens_per_step=1M"]
    _, rows = plan(parse(q))
    fsdp = [r for r in rows if r["strategy"] == "fsdp" and r["verdict"] == "fits"]
    assert fsdp and all("sync_every_microbatch=true" in r["knobs"] for r in fsdp)
    _, fixed = plan(parse([*q, "strategy=fsdp", "strategy.sync_every_microbatch=true"]))
    assert fsdp[0]["tokens_per_s"] == fixed[0]["tokens_per_s"]
    assert_first_row_replans([fsdp[0]])
    # one row per setting: no two rows share every column that describes what runs (and its numbers)
    seen = {(r["tp"], r["pp"], r["dp"], r["micro_batch_size"], r["grad_accum"], r["recompute"], r["precision"],
             r["compile"], r["knobs"].split(" ", 1)[-1], r["tokens_per_s"], r["needed_gib"]) for r in rows}
    assert len(seen) == len(rows)
    assert not any(r["strategy"] == "pp" and r["pp"] == 1 for r in rows)
    zero = [r for r in rows if r["strategy"] == "zero"]
    assert zero and all("zero_stage=" in r["knobs"] for r in zero)


def test_a_measured_error_every_row_shares_is_printed_once_and_each_rank_says_what_differs(tmp_path, capsys):
    """Over a sockets probe every row quotes the sockets regime's held-out error: the planner prints that sentence
    once, and by rank where the groups live and the error of the recorded runs with the layout's features.  Together
    they are, row by row, what ``python -m bench <the row's command> dry_run=true`` prints after its numbers (an
    independent re-plan through Hydra)."""
    argv = ["--config-dir", str(SLOW), "hardware=h100x4_sockets", "link_regime=sockets", "model=llama3_1b", "top=8",
            f"out={tmp_path}"]
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    shared = [line for line in printed if line.startswith("the prediction's error, every row: ")]
    assert len(shared) == 1 and "over the sockets link regime, held out of the fit" in shared[0]
    case = shared[0].split(": ", 1)[1].rsplit("; by rank, ", 1)[0]
    assert sum(case in line for line in printed) == 1  # the long sentence once, not once a rank
    by_rank = {}
    for line in printed[printed.index(shared[0]) + 1:]:
        if not line.startswith("  rank"):
            break
        ranks, text = line.strip().split(": ", 1)
        for part in ranks.split(" ", 1)[1].split(", "):
            a, _, b = part.partition("-")
            by_rank.update({r: text for r in range(int(a), int(b or a) + 1)})
    rows = json.loads((tmp_path / "plan.json").read_text())["rows"][:8]
    assert sorted(by_rank) == [r["rank"] for r in rows] and len(set(by_rank.values())) > 1
    for r in rows:
        statement = prediction_line(predict(replan(r["overrides"], str(SLOW)))).split("; ", 1)[1]
        assert statement == r["error"] and statement.replace(f"; {case}", "", 1) == by_rank[r["rank"]], r["command"]

"""The logger config group (bench/metrics/loggers.py): what each tracker wrote, read back with its own API.

Real ``python -m bench`` runs (CPU_FAST): one single run with logger=tensorboard, and one
--multirun of 2 runs per installed tracker (one completed, one failed by an injected fault) for
the grouping and the failed run's status; where a single run's files go is checked in-process.
Read back with: TensorBoard's EventAccumulator / EventMultiplexer; MLflow's MlflowClient on the
file store; wandb: the offline run file ``run-<id>.wandb`` decoded with wandb's own protobuf schema
(tests/wandb_reader.py; wandb 0.31 has no Python reader of its own for it any more and
no offline API).
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from bench.run.config import ConfigError, register_configs, validate
from bench import metrics
from bench.metrics.loggers import log_run
from tests.wandb_reader import read_wandb_run
from bench.run.runs import run_key
from tests.conftest import CPU_FAST, REPO, metrics_of, run_bench

register_configs()
BACKENDS = ("tensorboard", "mlflow", "wandb")


def installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def needs(name: str):
    return pytest.mark.skipif(not installed(name), reason=f"{name} not installed (pip install -e '.[loggers]')")


def cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


# ------------------------------------------------------------------------------ config
def test_logger_group_defaults_to_none_and_is_not_part_of_the_run_key():
    from omegaconf import OmegaConf

    c = cfg()
    assert c.logger.name == "none" and c.logger.mode == "offline" and c.logger.dir is None
    base = OmegaConf.to_container(c, resolve=True)
    without = {k: v for k, v in base.items() if k != "logger"}  # a run recorded before the logger group
    for name in BACKENDS:
        other = OmegaConf.to_container(cfg(f"logger={name}", "logger.experiment=x"), resolve=True)
        assert other["logger"]["name"] == name
        assert run_key(other) == run_key(base) == run_key(without)  # sweep folders still resume


def test_unknown_logger_and_wandb_mode_are_refused():
    with pytest.raises(Exception):
        cfg("logger=neptune")  # not in conf/logger/: Hydra refuses the group choice
    with pytest.raises(ConfigError) as e:
        validate(cfg("logger.name=neptune"), gpus=0)
    assert e.value.key == "logger.name" and "tensorboard" in str(e.value)  # the key typed, what is valid
    if installed("wandb"):
        with pytest.raises(ConfigError) as e:
            validate(cfg("logger=wandb", "logger.mode=cloud"), gpus=0)
        assert e.value.key == "logger.mode"


def test_missing_package_fails_before_launch(bench_run, tmp_path):
    """logger=mlflow where mlflow cannot be imported: refused at validation (exit 2, status invalid),
    naming the key and what to install; no rank is started."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        class _NoMlflow:  # as if mlflow were not installed
            def find_spec(self, name, path=None, target=None):
                if name == "mlflow" or name.startswith("mlflow."):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None
        sys.meta_path.insert(0, _NoMlflow())
    """))
    p, d = bench_run(*CPU_FAST, "logger=mlflow", env={"PYTHONPATH": str(block)})
    assert p.returncode == 2, p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert "logger='mlflow'" in out and "pip install mlflow-skinny" in out and ".[loggers]" in out
    m = metrics_of(d)
    assert m["status"] == "invalid" and m["error"]["key"] == "logger"
    assert not list(d.glob("rank*.json")) and not list(d.glob("rank*.log"))  # nothing was launched
    assert not (d / "mlruns").exists()


# ------------------------------------------------------------------------------ what is logged
def check_series(m: dict, loss: dict, step_time: dict):
    """loss for every step (warm-up included) and step time for the timed steps, by global step."""
    per_step = m["loss"]["per_step"]
    assert sorted(loss) == list(range(len(per_step)))
    for n, x in enumerate(per_step):
        assert loss[n] == pytest.approx(x, rel=1e-6)
    warm = m["config"]["warmup_steps"]
    assert sorted(step_time) == list(range(warm, m["config"]["steps"]))
    for i, t in enumerate(m["step_time_s"]["all"]):
        assert step_time[warm + i] == pytest.approx(t, rel=1e-6)


def hparams_of(ea) -> dict:
    from tensorboard.plugins.hparams import plugin_data_pb2

    start = plugin_data_pb2.HParamsPluginData.FromString(ea.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    return {k: v.string_value or v.number_value or v.bool_value for k, v in start.session_start_info.hparams.items()}


@pytest.mark.slow
@needs("tensorboard")
def test_tensorboard_single_run_writes_loss_series_summary_and_hparams(bench_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    p, d = bench_run(*CPU_FAST, "logger=tensorboard")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "logger=tensorboard: run recorded in" in p.stdout + p.stderr
    m = metrics_of(d)
    ea = EventAccumulator(str(d / "tensorboard" / d.name))  # a single run: in its own folder
    ea.Reload()
    scalars = ea.Tags()["scalars"]
    assert {"loss", "step_time_s", "step_tokens_per_s", "summary/tokens_per_s", "summary/host_peak_rss_mb"} <= set(scalars)
    assert [e.step for e in ea.Scalars("loss")] == [0, 1, 2, 3]
    check_series(m, {e.step: e.value for e in ea.Scalars("loss")}, {e.step: e.value for e in ea.Scalars("step_time_s")})
    tps = m["throughput"]["tokens_per_step"]
    for e in ea.Scalars("step_tokens_per_s"):
        assert e.value == pytest.approx(tps / m["step_time_s"]["all"][e.step - 1], rel=1e-5)
    assert ea.Scalars("summary/tokens_per_s")[0].value == pytest.approx(m["throughput"]["tokens_per_s"], rel=1e-6)
    hp = hparams_of(ea)
    assert hp["model.name"] == "tiny" and hp["strategy.name"] == "single" and hp["steps"] == 4
    assert hp["status"] == "completed" and hp["logger.name"] == "tensorboard"


def fake_run(d: Path, status: str = "completed") -> dict:
    """A run folder with a metrics.json as bench writes it (no Hydra, no sweep)."""
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg(*CPU_FAST), resolve=True)
    m = metrics.skeleton(c, status)
    m["loss"].update(per_step=[9.1, 9.0, 8.9, 8.8], first=9.1, last=8.8)
    m["step_time_s"].update(all=[0.5, 0.25, 0.2], median=0.25)
    m["throughput"].update(tokens_per_step=1024, tokens_per_s=4096.0)
    m["memory"]["host_peak_rss_mb"] = 600.0
    m["job"] = {"key": "k", "wall_s": 7.0, "overhead_s": 5.0}
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps(m))
    return m


@needs("mlflow")
def test_mlflow_single_run_goes_to_its_folder_and_mlflow_params_are_flat(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    d = tmp_path / "outputs" / "run"
    m = fake_run(d)
    assert log_run(d, {**m["config"], "logger": {"name": "mlflow"}}, m).startswith((d / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(d / "mlruns").as_uri())
    (r,) = client.search_runs([client.get_experiment_by_name("bench").experiment_id])
    assert r.info.run_name == "run" and r.info.status == "FINISHED" and "bench.sweep_dir" not in r.data.tags
    assert r.data.params["model.name"] == "tiny" and r.data.params["optim.lr"] == str(m["config"]["optim"]["lr"])
    assert r.data.params["logger.name"] == "mlflow" and "_command" not in r.data.params
    hist = lambda k: {x.step: x.value for x in client.get_metric_history(r.info.run_id, k)}  # noqa: E731
    check_series(m, hist("loss"), hist("step_time_s"))
    assert hist("step_tokens_per_s") == pytest.approx({1: 2048.0, 2: 4096.0, 3: 5120.0})
    assert r.data.metrics["tokens_per_s"] == 4096.0 and r.data.metrics["wall_s"] == 7.0


@needs("wandb")
def test_wandb_single_run_goes_to_its_folder_offline(tmp_path):
    d = tmp_path / "outputs" / "run"
    m = fake_run(d)
    where = log_run(d, {**m["config"], "logger": {"name": "wandb", "mode": "offline"}}, m)
    (f,) = wandb_run_files(d)
    assert Path(where) == f.parent
    w = read_wandb_run(f)
    assert (w["project"], w["name"], w["group"]) == ("bench", "run", "")
    assert w["config"]["model"]["name"] == "tiny" and "_command" not in w["config"]
    check_series(m, {h["_step"]: h["loss"] for h in w["history"] if "loss" in h},
                 {h["_step"]: h["step_time_s"] for h in w["history"] if "step_time_s" in h})
    assert w["summary"]["tokens_per_s"] == 4096.0 and w["summary"]["status"] == "completed"


def test_a_tracker_that_fails_costs_only_a_warning(tmp_path, caplog):
    d = tmp_path / "run"
    m = fake_run(d)
    (tmp_path / "blocked").write_text("a file where the tracker wants a folder")
    for name in [n for n in BACKENDS if installed(n) and n != "wandb"]:
        assert log_run(d, {**m["config"], "logger": {"name": name, "dir": str(tmp_path / "blocked")}}, m) is None
        assert f"logger={name}: could not record the run" in caplog.text


def wandb_run_files(root: Path) -> list[Path]:
    return sorted(root.glob("wandb/offline-run-*/run-*.wandb"))


# ------------------------------------------------------------------------------ a sweep is one group
@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Per installed tracker, 2 runs in one sweep: one completes, one fails at step 2."""
    names = [n for n in BACKENDS if installed(n)]
    if not names:
        pytest.skip("no logger package installed (pip install -e '.[loggers]')")
    d = tmp_path_factory.mktemp("loggers") / "sweep"
    p = run_bench(*CPU_FAST, f"logger={','.join(names)}", "fault.kind=none,raise", "fault.step=2", run_dir=d,
                  multirun=True)
    assert p.returncode == 1, p.stderr[-3000:]  # the failed runs fail the sweep
    jobs = json.loads((d / "sweep.json").read_text())["jobs"]
    by: dict = {}  # logger -> {"none": folder of the completed run, "raise": the failed one}
    for j in jobs:
        o = dict(x.split("=", 1) for x in j["overrides"])
        by.setdefault(o["logger"], {})[o["fault.kind"]] = j["dir"]
    return d, by, jobs


@pytest.mark.slow
def test_sweep_folders_are_the_runs_only(sweep):
    """The trackers' folders in the sweep dir are no run folders to the sweep or to the analysis."""
    from multirun_analysis.load import find_runs

    d, by, jobs = sweep
    s = json.loads((d / "summary.json").read_text())
    assert s["counts"]["completed"] == s["counts"]["failed"] == len(by)
    assert sorted(p.name for p in find_runs([d])[0]) == sorted(j["dir"] for j in jobs)


@pytest.mark.slow
@needs("tensorboard")
def test_tensorboard_sweep_is_one_log_dir_with_a_run_per_job(sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    d, by, _ = sweep
    runs = by["tensorboard"]
    em = EventMultiplexer()
    em.AddRunsFromDirectory(str(d / "tensorboard"))
    em.Reload()
    assert sorted(em.Runs()) == sorted(runs.values())
    m = metrics_of(d / runs["none"])
    check_series(m, {e.step: e.value for e in em.Scalars(runs["none"], "loss")},
                 {e.step: e.value for e in em.Scalars(runs["none"], "step_time_s")})
    assert "loss" not in em.GetAccumulator(runs["raise"]).Tags()["scalars"]  # no measurements of a failed run
    ea = EventAccumulator(str(d / "tensorboard" / runs["raise"]))
    ea.Reload()
    assert hparams_of(ea)["status"] == "failed"
    assert "injected fault" in ea.Tensors("status/text_summary")[0].tensor_proto.string_val[0].decode()


@pytest.mark.slow
@needs("mlflow")
def test_mlflow_sweep_is_one_experiment(sweep, monkeypatch):
    from mlflow.tracking import MlflowClient

    d, by, _ = sweep
    runs = by["mlflow"]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(d / "mlruns").resolve().as_uri())
    exps = [e for e in client.search_experiments() if e.name != "Default"]
    assert [e.name for e in exps] == [str(d)]  # named after the sweep folder
    found = {r.info.run_name: r for r in client.search_runs([exps[0].experiment_id])}
    assert sorted(found) == sorted(runs.values())
    assert {r.data.tags["bench.sweep_dir"] for r in found.values()} == {str(d)}
    ok, bad = found[runs["none"]], found[runs["raise"]]
    m = metrics_of(d / runs["none"])
    assert ok.info.status == "FINISHED" and ok.data.tags["bench.status"] == "completed"
    assert ok.data.params["fault.kind"] == "none" and ok.data.params["model.name"] == "tiny"
    hist = lambda r, k: {x.step: x.value for x in client.get_metric_history(r.info.run_id, k)}  # noqa: E731
    check_series(m, hist(ok, "loss"), hist(ok, "step_time_s"))
    assert ok.data.metrics["tokens_per_s"] == pytest.approx(m["throughput"]["tokens_per_s"])
    assert ok.data.metrics["host_peak_rss_mb"] == pytest.approx(m["memory"]["host_peak_rss_mb"])
    assert [a.path for a in client.list_artifacts(ok.info.run_id)] == ["bench_metrics.json"]
    assert bad.info.status == "FAILED" and bad.data.tags["bench.status"] == "failed"
    assert "injected fault" in bad.data.tags["bench.error"] and "loss" not in bad.data.metrics


@pytest.mark.slow
@needs("wandb")
def test_wandb_sweep_is_one_group(sweep):
    d, by, _ = sweep
    runs = by["wandb"]
    ws = {w["name"]: w for w in map(read_wandb_run, wandb_run_files(d))}
    assert sorted(ws) == sorted(runs.values())
    assert {w["group"] for w in ws.values()} == {str(d)} and {w["project"] for w in ws.values()} == {"bench"}
    ok, bad = ws[runs["none"]], ws[runs["raise"]]
    m = metrics_of(d / runs["none"])
    assert ok["config"]["fault"]["kind"] == "none" and ok["config"]["strategy"]["name"] == "single"
    check_series(m, {h["_step"]: h["loss"] for h in ok["history"] if "loss" in h},
                 {h["_step"]: h["step_time_s"] for h in ok["history"] if "step_time_s" in h})
    assert ok["summary"]["tokens_per_s"] == pytest.approx(m["throughput"]["tokens_per_s"])
    assert ok["summary"]["status"] == "completed"
    assert bad["summary"]["status"] == "failed" and "injected fault" in bad["summary"]["error"]

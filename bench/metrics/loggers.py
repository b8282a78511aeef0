"""Experiment trackers: the ``logger`` config group (conf/logger/): none, tensorboard, mlflow, wandb.

A logger records each run once it has ended, from its final ``metrics.json``: bench/launch/job.py's
``finish`` calls :func:`log_run` in the launching process (rank 0's host under SLURM) after
metrics.json and status.json are written.  So nothing is logged inside the timed window (nor
inside any rank), failed / oom / timeout / interrupted runs are logged too, with their status,
and a tracker that fails (no server, full disk) only costs a warning: the run's result is
already in its folder.  What is recorded, under the same names in every backend:

* the resolved config: TensorBoard hparams, MLflow params (flattened: ``strategy.zero_stage``),
  wandb config (nested);
* per-step series, x = the step's global number (0 = first warm-up step): ``loss`` for every
  step (``loss.per_step``, warm-up included), ``step_time_s`` and ``step_tokens_per_s``
  (tokens per step / that step's time) for the timed steps (``step_time_s.all``);
* summary numbers: ``tokens_per_s``, ``tokens_per_s_per_device``, ``step_time_median_s``,
  ``mfu``, peak memory (``max_allocated_mb`` on CUDA, ``host_peak_rss_mb``; metrics.json has no
  per-step memory), ``loss_first`` / ``loss_last``, ``wall_s`` / ``overhead_s``, and with
  ``metrics.profile_steps`` the time breakdown (``profile_<part>_ms``, mean over ranks); the
  ``status`` (completed, failed, oom, ...) as a tag / text / summary string.

Grouping.  A sweep (``--multirun``) is one group; a single run is a group of its own:

* tensorboard: one log dir per run, ``<root>/[<experiment>/]<run folder name>``; root =
  ``logger.dir``, else ``<sweep dir>/tensorboard`` (sweep) or ``<run dir>/tensorboard`` (single
  run): ``tensorboard --logdir <sweep dir>/tensorboard`` shows the sweep's runs side by side.
* mlflow: one experiment per sweep, named ``logger.experiment``, else the sweep folder's path
  (single runs: ``bench``), one MLflow run per bench run (named after its folder; tags
  ``bench.sweep_dir``, ``bench.run_dir``, ``bench.status`` ...; metrics.json as an artifact).
  Tracking URI = ``logger.tracking_uri`` (a server, ``sqlite:///...``), else a file store in
  ``logger.dir``, else ``<sweep dir>/mlruns`` / ``<run dir>/mlruns``.  MLflow 3.x keeps its
  file store in maintenance mode behind ``MLFLOW_ALLOW_FILE_STORE=true``, which bench sets for
  ``file:`` URIs (it works without a server or a database package).
* wandb: ``group=<sweep folder's path>`` (single runs: no group), ``project=logger.experiment``
  (else ``bench``), ``mode=logger.mode`` (``offline`` by default: no server, no account;
  ``wandb sync <dir>`` uploads later), files in ``<logger.dir or sweep dir or run dir>/wandb/``.

A logger does not change what a run measures: ``logger`` is left out of the run key
(volatile in bench/spec/schema.py), so a sweep folder resumes whatever logger it ran with.  The
packages are the optional extra ``loggers`` (``pip install -e .[loggers]``);
:func:`check` (called by bench.run.config.validate) refuses a logger whose package is missing
before anything is launched.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from bench.spec.schema import LoggerConfig, typed

log = logging.getLogger("bench.loggers")

# logger -> (module that must import, what to pip install)
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow-skinny"),
            "wandb": ("wandb", "wandb")}
FOLDERS = {"tensorboard": "tensorboard", "mlflow": "mlruns", "wandb": ""}  # default root in the sweep/run dir


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check(c: Optional[dict]) -> None:
    """Config rules of ``logger`` beyond its choices (raises ConfigError): its package is installed."""
    from bench.spec.schema import ConfigError

    if not c:
        return
    name = c.get("name")
    if name in PACKAGES:
        module, pip = PACKAGES[name]
        if not _installed(module):
            raise ConfigError("logger", name, f"needs the Python package '{pip}', which is not installed here: "
                              f"pip install {pip} (or pip install -e '.[loggers]' for every logger), "
                              "or run with logger=none")


# ------------------------------------------------------------------------------ what is logged
def _num(x) -> Optional[float]:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested config -> {"a.b": value}; lists stay values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def scalar(v) -> Any:
    """A config value as TensorBoard hparams / MLflow params take it (bool, int, float or str)."""
    if isinstance(v, (bool, int, float, str)):
        return v
    return json.dumps(v, default=str)


@dataclass
class Record:
    """One run as every backend logs it."""

    run_dir: Path
    run_name: str  # the run folder's name
    sweep_dir: Optional[Path]  # the sweep folder, None for a single run
    status: str
    config: dict  # resolved, without bench's bookkeeping (_command)
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # name -> [(step, value)]
    summary: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def params(self) -> dict[str, Any]:
        return {k: scalar(v) for k, v in flatten(self.config).items()}

    def steps(self) -> list[tuple[int, dict[str, float]]]:
        """The series as one {name: value} per step, in step order (wandb logs steps that way)."""
        by: dict[int, dict[str, float]] = {}
        for name, pts in self.series.items():
            for s, v in pts:
                by.setdefault(s, {})[name] = v
        return sorted(by.items())


def summary_of(m: dict) -> dict[str, float]:
    g = lambda sec, k: (m.get(sec) or {}).get(k) if isinstance(m.get(sec), dict) else None  # noqa: E731
    vals = {
        "tokens_per_s": g("throughput", "tokens_per_s"), "tokens_per_s_per_device": g("throughput", "tokens_per_s_per_device"),
        "timed_window_s": g("throughput", "timed_window_s"), "step_time_median_s": g("step_time_s", "median"),
        "step_time_p90_s": g("step_time_s", "p90"), "mfu": g("flops", "mfu"),
        "achieved_tflops_per_device": g("flops", "achieved_tflops_per_device"),
        "max_allocated_mb": g("memory", "max_allocated_mb"), "max_reserved_mb": g("memory", "max_reserved_mb"),
        "host_peak_rss_mb": g("memory", "host_peak_rss_mb"), "nvml_used_peak_mb": g("memory", "nvml_used_peak_mb"),
        "loss_first": g("loss", "first"), "loss_last": g("loss", "last"),
        "joules_per_token": g("energy", "joules_per_token"), "skipped_timed_steps": g("skipped_steps", "timed"),
        "wall_s": g("job", "wall_s"), "overhead_s": g("job", "overhead_s"),
    }
    profs = [p.get("breakdown_ms_per_step") for p in (m.get("profile") or []) if isinstance(p, dict)]
    profs = [b for b in profs if isinstance(b, dict)]
    for part in ("compute", "communication", "overlapped", "idle", "wall"):
        xs = [_num(b.get(part)) for b in profs]
        xs = [x for x in xs if x is not None]
        vals[f"profile_{part}_ms"] = sum(xs) / len(xs) if xs else None
    return {k: float(v) for k, v in vals.items() if _num(v) is not None}


def series_of(m: dict, warmup: int) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    losses = (m.get("loss") or {}).get("per_step") or []
    out["loss"] = [(n, float(x)) for n, x in enumerate(losses) if _num(x) is not None]
    times = (m.get("step_time_s") or {}).get("all") or []
    out["step_time_s"] = [(warmup + i, float(t)) for i, t in enumerate(times) if _num(t) is not None]
    tps = _num((m.get("throughput") or {}).get("tokens_per_step"))
    out["step_tokens_per_s"] = [(s, tps / t) for s, t in out["step_time_s"]] if tps else []
    return {k: v for k, v in out.items() if v}


def record_of(run_dir: Path, cfg: dict, m: dict, sweep_dir: Optional[Path]) -> Record:
    config = {k: v for k, v in cfg.items() if not k.startswith("_")}
    ident = {k: cfg.get(k) for k in ("world_size", "precision")}
    tags = {"bench.status": str(m.get("status")), "bench.run_dir": str(run_dir),
            "bench.model": str((cfg.get("model") or {}).get("name")),
            "bench.strategy": str((cfg.get("strategy") or {}).get("name")),
            **{f"bench.{k}": str(v) for k, v in ident.items()},
            "bench.key": str((m.get("job") or {}).get("key"))}
    if sweep_dir is not None:
        tags["bench.sweep_dir"] = str(sweep_dir)
    err = m.get("error") if isinstance(m.get("error"), dict) else None
    if err and err.get("message"):
        tags["bench.error"] = str(err["message"]).splitlines()[0][:500]
    return Record(run_dir=run_dir, run_name=run_dir.name, sweep_dir=sweep_dir, status=str(m.get("status")),
                  config=config, series=series_of(m, int(cfg.get("warmup_steps") or 0)), summary=summary_of(m),
                  tags=tags)


def sweep_dir_of(run_dir: Path) -> Optional[Path]:
    """The sweep folder when this run is one job of a --multirun (None for a single run)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized():
            hc = HydraConfig.get()
            return Path(str(hc.sweep.dir)) if hc.mode == RunMode.MULTIRUN else None
    except Exception:  # noqa: BLE001 - no Hydra context (a test, a script): the sweeper's files tell
        pass
    return run_dir.parent if (run_dir.parent / "multirun.yaml").is_file() else None


def _root(rec: Record, lc: LoggerConfig, backend: str) -> Path:
    if lc.dir:
        return Path(lc.dir)
    base = rec.sweep_dir if rec.sweep_dir is not None else rec.run_dir
    return base / FOLDERS[backend] if FOLDERS[backend] else base


def _group(rec: Record, lc: LoggerConfig, single: Optional[str]) -> Optional[str]:
    if lc.experiment:
        return str(lc.experiment)
    return str(rec.sweep_dir) if rec.sweep_dir is not None else single


# ------------------------------------------------------------------------------ backends
def to_tensorboard(rec: Record, lc: LoggerConfig) -> str:
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    sub = Path(lc.experiment) / rec.run_name if lc.experiment else Path(rec.run_name)
    logdir = _root(rec, lc, "tensorboard") / sub
    w = SummaryWriter(log_dir=str(logdir))
    try:
        for name, pts in rec.series.items():
            for step, v in pts:
                w.add_scalar(name, v, step)
        metrics = {f"summary/{k}": v for k, v in rec.summary.items()}
        for k, v in metrics.items():
            w.add_scalar(k, v, 0)
        w.add_text("status", rec.status + (f": {rec.tags['bench.error']}" if "bench.error" in rec.tags else ""), 0)
        # the hparams plugin's three summaries, in this run's own event file (add_hparams would
        # write them into a sub-run)
        hp = {**rec.params, "status": rec.status}
        for s in hparams(hp, metrics):
            w.file_writer.add_summary(s)
    finally:
        w.close()
    return str(logdir)


def m_json(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}


def to_mlflow(rec: Record, lc: LoggerConfig) -> str:
    uri = lc.tracking_uri
    if not uri:
        root = _root(rec, lc, "mlflow")
        root.mkdir(parents=True, exist_ok=True)
        uri = root.resolve().as_uri()
    if uri.startswith("file:"):  # MLflow 3.x: the file store is in maintenance mode, behind this switch
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    name = _group(rec, lc, "bench")
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        eid = exp.experiment_id
    else:
        try:
            eid = client.create_experiment(name)
        except MlflowException:  # another job of a parallel sweep created it first
            eid = client.get_experiment_by_name(name).experiment_id
    now = int(time.time() * 1000)
    wall = rec.summary.get("wall_s")
    run = client.create_run(eid, run_name=rec.run_name, start_time=now - int(1000 * wall) if wall else now,
                            tags=rec.tags)
    rid = run.info.run_id
    try:
        params = [Param(k[:250], str(v)[:6000]) for k, v in rec.params.items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            client.log_batch(rid, params=params[i:i + 100])
        metrics = [Metric(n, v, now, s) for n, pts in rec.series.items() for s, v in pts]
        metrics += [Metric(k, v, now, 0) for k, v in rec.summary.items()]
        for i in range(0, len(metrics), 1000):  # at most 1000 metrics per batch
            client.log_batch(rid, metrics=metrics[i:i + 1000])
        # the run's metrics.json as an artifact, under another name: a file called metrics.json would make
        # mlruns/.../artifacts/ look like a run folder to multirun_analysis
        client.log_dict(rid, m_json(rec.run_dir), "bench_metrics.json")
    except BaseException:
        client.set_terminated(rid, "FAILED")
        raise
    client.set_terminated(rid, "FINISHED" if rec.status == "completed" else "FAILED")
    return f"{uri} experiment {name!r} run {rid}"


def to_wandb(rec: Record, lc: LoggerConfig) -> str:
    import wandb

    root = _root(rec, lc, "wandb")
    root.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, save_code=False)
    run = wandb.init(project=lc.experiment or "bench", group=str(rec.sweep_dir) if rec.sweep_dir else None,
                     name=rec.run_name, dir=str(root), mode=lc.mode or "offline", config=rec.config,
                     job_type="bench", reinit="create_new", settings=settings,
                     tags=[rec.tags["bench.model"], rec.tags["bench.strategy"], rec.status])
    try:
        for step, vals in rec.steps():
            run.log(vals, step=step)
        run.summary.update({**rec.summary, "status": rec.status,
                            **({"error": rec.tags["bench.error"]} if "bench.error" in rec.tags else {})})
        where = Path(run.dir).parent  # run.dir: <root>/wandb/<offline-run-...>/files
    finally:
        run.finish(exit_code=0 if rec.status == "completed" else 1)
    return str(where)


BACKENDS: dict[str, Callable[[Record, LoggerConfig], str]] = {
    "tensorboard": to_tensorboard, "mlflow": to_mlflow, "wandb": to_wandb}


def log_run(run_dir: Path, cfg: Optional[dict], m: dict) -> Optional[str]:
    """Record one ended run with the configured logger; returns where it went (None: no logger, or
    it failed: a warning says why).  Never raises: the run's result is already in its folder.  ``cfg``: the run's
    config as recorded (the plan's; the composed one where it did not validate); its logger section read typed."""
    lc = typed(LoggerConfig, (cfg or {}).get("logger") or {})
    name = lc.name or "none"
    if name == "none":
        return None
    if name not in BACKENDS or not _installed(PACKAGES[name][0]):
        log.warning("logger=%s: not available here, run not recorded (its results are in %s)", name, run_dir)
        return None
    try:
        rec = record_of(Path(run_dir), cfg, m, sweep_dir_of(Path(run_dir)))
        where = BACKENDS[name](rec, lc)
    except Exception as e:  # noqa: BLE001
        log.warning("logger=%s: could not record the run (%s: %s); its results are in %s", name,
                    type(e).__name__, e, run_dir)
        return None
    log.info("logger=%s: run recorded in %s", name, where)
    return where

"""One Hydra job = one benchmark run: validate -> (memory plan) -> launch -> record.

:func:`main_task` is the Hydra task function (a single run and each job of a sweep, local or in a
submitit/SLURM task).  Locally, :func:`run` launches every rank (bench/launch/); inside a
submitit task this process is itself one rank and :func:`run_task` takes over.  A single run
reports a failure through its exit code; in a sweep the status is returned and the sweep goes on.

The run folder Hydra created holds everything of the run: ``status.json`` (pending - written by
the sweeper -, running, then the final status; with the run key, model/strategy/world size, wall
time and fixed overhead), ``metrics.json`` (always written, with the status; measurements null
unless completed; its ``job`` section has the run key, wall time and overhead), the ranks'
``rank{r}.json`` / ``rank{r}.log`` and, on failure, ``failure_rank{r}.json``.  A failing run
never stops a sweep: the job returns its status.  Only an interrupted run (Ctrl-C) stops it
(bench/sweep/).  A folder that holds a completed result is never written over.

Fixed overhead per run (``job`` in metrics.json, and status.json): ``startup_s`` = job start
(the task function) -> rank 0 starts its first step (process spawn, imports, process group,
model build, strategy setup); ``teardown_s`` = rank 0 ends its last step -> the job has recorded
everything (gather, metrics, process group teardown, process exit); ``overhead_s`` = both;
``warmup_extra_s`` = the warm-up's time beyond its steps at the timed steps' median step (compilation, CUDA graph
capture, the allocator's first growth); ``outside_steps_s`` = ``overhead_s`` + ``warmup_extra_s``: what a sweep
spends on a run that is not steps.
"""
from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Iterable, Optional

from omegaconf import DictConfig, OmegaConf

from bench import metrics
from bench.metrics import loggers
from bench.run.config import validate
from bench.models.data import loss_note
from bench.jsonio import read_json_dict, write_json_atomic
from bench.metrics import STATUSES, identity
from bench.run.runs import holds_completed, read_failures, run_key, write_status
from bench.spec.schema import ConfigError, Plan
from bench.units import count_text

log = logging.getLogger("bench")


def job_timing(run_dir: Path, t0: float, t_end: float) -> dict:
    """Wall time and fixed overhead of a run (from rank 0's step timestamps, when it got that far), and the time
    outside the steps: the fixed overhead plus what the warm-up took beyond its steps at the timed steps' median
    (compilation, CUDA graph capture, the allocator's first growth)."""
    r0 = read_json_dict(run_dir / "rank0.json") or {}
    start = r0.get("t_first_step")
    end = r0.get("t_loop_end")
    startup = start - t0 if start else None
    teardown = t_end - end if end else None
    overhead = startup + teardown if startup is not None and teardown is not None else None
    timed, warm_s = r0.get("step_times") or [], r0.get("warmup_s")
    warm_extra = None
    if timed and warm_s is not None:
        warm_extra = max(0.0, warm_s - (len(r0.get("losses") or timed) - len(timed)) * statistics.median(timed))
    return {"wall_s": t_end - t0, "startup_s": startup, "teardown_s": teardown, "overhead_s": overhead,
            "warmup_extra_s": warm_extra,
            "outside_steps_s": overhead + warm_extra if overhead is not None and warm_extra is not None else None}


def finish(run_dir: Path, raw: dict, status: str, error: Optional[dict], failures: list, base: dict,
           t0: float, plan: Optional[Plan] = None) -> str:
    """Write the final metrics.json (the workers' one when completed) and status.json."""
    mpath = run_dir / "metrics.json"
    m = read_json_dict(mpath) if status == "completed" else None
    if m is None or m.get("status") != "completed":
        if status == "completed":  # the ranks ended well but rank 0's metrics.json is missing
            status, error = "failed", {"rank": 0, "type": "MissingMetrics",
                                       "message": "all ranks exited 0 but metrics.json was not written",
                                       "traceback": None}
        m = metrics.skeleton(plan.cfg if plan else raw, status if status in STATUSES else "failed", error)
        m["failures"] = failures
        if plan is not None:  # a failure names the resolved model and its plan, whatever the model's source
            m["memory"]["plan"] = plan.memory
        # what the allocator saw on the rank that failed first (its failure record; None on CPU)
        m["memory"]["allocator"] = next((f["allocator"] for f in failures or [] if f.get("allocator")), None)
        m["placement"] = _placement(run_dir)
    timing = job_timing(run_dir, t0, time.time())
    m["job"] = {"key": base["key"], **timing}
    write_json_atomic(mpath, m)
    extra = {"reason": (error or {}).get("message")} if m["status"] != "completed" else {}
    write_status(run_dir, m["status"], **base, **timing, **extra)
    if error and error.get("traceback"):
        log.error("rank %s failed:\n%s", error.get("rank"), error["traceback"])
    log.info(metrics.one_line(m))
    vocab = ((m.get("config") or {}).get("model") or {}).get("vocab_size")
    if m["status"] == "completed" and vocab:  # where the loss is reported: why it does not fall
        log.info("loss: %s", loss_note(vocab))
    if timing["overhead_s"] is not None:
        log.info("wall %.1f s, fixed overhead %.1f s (launch -> first step %.1f s, last step -> done %.1f s)%s",
                 timing["wall_s"], timing["overhead_s"], timing["startup_s"], timing["teardown_s"],
                 "" if timing["outside_steps_s"] is None else
                 f"; {timing['outside_steps_s']:.1f} s outside the steps with the warm-up's compile and capture "
                 f"({timing['warmup_extra_s']:.1f} s)")
    loggers.log_run(run_dir, plan.cfg if plan else raw, m)  # the logger group: after the run's files are final
    return m["status"]


def _placement(run_dir: Path) -> Optional[dict]:
    """Where the ranks of a run that did not complete ran, from what they wrote at their start (SLURM tasks)."""
    from bench.machine.placement import read_placements, summary

    found = read_placements(run_dir)
    return summary([found.get(r) for r in range(max(found) + 1)]) if found else None


def record_invalid(run_dir: Path, raw: dict, base: dict, e: ConfigError, t0: float) -> str:
    log.error("%s", e)
    return finish(run_dir, raw, "invalid", {"rank": None, "type": "ConfigError", "message": str(e),
                                           "traceback": None, "key": e.key, "value": e.value}, [], base, t0)


def plan_run(cfg: DictConfig, run_dir: Path, explicit: Iterable[str] = (),
             gpus: Optional[int] = None) -> tuple[dict, dict, Optional[Plan], Optional[ConfigError]]:
    """(raw config, status base, plan or None, the ConfigError or None): the run key is the plan's
    (with tuning=best: the settings that will run), or the raw config's when it cannot run."""
    raw = OmegaConf.to_container(cfg, resolve=True)
    try:
        plan, err = validate(cfg, gpus=gpus, explicit=explicit), None
    except ConfigError as e:
        plan, err = None, e
    if plan is not None:
        from bench.plan.memory_model import memory_plan

        plan = resolve_choices(plan, explicit, gpus, run_dir.name)
        plan.memory = memory_plan(plan)
    final = plan.cfg if plan else raw
    return raw, {"key": run_key(final), **identity(final), "t_start": time.time()}, plan, err


def resolve_choices(plan: Plan, explicit: Iterable[str], gpus: Optional[int], run: str = "") -> Plan:
    """``micro_batch_size=auto`` / ``tuning=best``: the fastest predicted setting that fits, not only the largest
    micro-batch (bench/planner/resolve.py; here, since validation is a layer below prediction)."""
    from bench.planner.resolve import resolved

    return resolved(plan, explicit, gpus, run)


def run(cfg: DictConfig, run_dir: Path, command: list[str], t0: Optional[float] = None,
        explicit: Iterable[str] = ()) -> str:
    """Run one benchmark into run_dir; returns its final status."""
    from bench.launch.local import launch_local

    t0 = time.time() if t0 is None else t0
    run_dir.mkdir(parents=True, exist_ok=True)
    if holds_completed(run_dir):
        log.error("%s already holds a completed result: not running into it (use another folder)", run_dir)
        return "refused"
    raw, base, plan, err = plan_run(cfg, run_dir, explicit)
    write_status(run_dir, "running", **base)
    if err is not None:
        return record_invalid(run_dir, raw, base, err, t0)
    try:
        from bench.plan.memory_model import fits

        mem = plan.memory
        log.info("run %s: model=%s strategy=%s world_size=%d device=%s backend=%s precision=%s; %s",
                 run_dir, plan.model.name, plan.strategy.name, plan.world_size, plan.device,
                 plan.backend, plan.run.precision, mem["summary"])
        log_choices(plan)
        verdict = fits(mem, plan)
        if verdict is not None and not plan.run.force_run:
            return finish(run_dir, raw, "skipped", {"rank": None, "type": "PredictedOOM", "message":
                                                    f"{verdict}; {way_out(plan)}", "traceback": None}, [], base, t0,
                          plan)
        plan.command = command
        outcome = launch_local(plan, run_dir)
        return finish(run_dir, raw, outcome.status, outcome.error, outcome.failures, base, t0, plan)
    except KeyboardInterrupt:
        finish(run_dir, raw, "interrupted", {"rank": None, "type": "KeyboardInterrupt",
                                             "message": "interrupted (Ctrl-C)", "traceback": None},
               read_failures(run_dir), base, t0, plan)
        raise


def main_task(cfg: DictConfig) -> str:
    """The Hydra task function (single run and each multirun job, local or under submitit/SLURM)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    t0 = time.time()
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    # the command that repeats this one run (a sweep's argv would repeat the whole sweep)
    overrides = list(hc.overrides.task)
    command = [sys.executable, "-m", "bench", *overrides]
    explicit = [o.split("=", 1)[0].lstrip("+~") for o in overrides]  # with tuning=best these win
    if cfg.get("submit") and hc.mode == RunMode.RUN and not os.environ.get("SUBMITIT_EXECUTOR"):
        log.error("invalid config: submit=%s: a single run is submitted through the sweeper; name it on the command "
                  "line (python -m bench submit=%s ..., or hydra/launcher=%s) without --run", *[cfg.submit] * 3)
        raise SystemExit(2)
    try:
        if cfg.get("dry_run"):
            status = dry_run(cfg, run_dir, explicit)
        elif os.environ.get("SUBMITIT_EXECUTOR"):  # this process is one rank of a submitit/SLURM task
            status = run_task(cfg, run_dir, command, t0, explicit)
        else:
            status = run(cfg, run_dir, command, t0, explicit)
    except KeyboardInterrupt:
        if hc.mode == RunMode.RUN:
            raise SystemExit(130)
        raise  # the sweeper stops the sweep
    if hc.mode == RunMode.RUN and status != "completed":
        # a single run reports failure through its exit code; a sweep goes on
        raise SystemExit(exit_code(status))
    return status


def run_task(cfg: DictConfig, run_dir: Path, command: list[str], t0: float, explicit: Iterable[str] = ()) -> str:
    """One rank of a submitit task (bench/launch/slurm/ sizes each job: one task per rank); rank 0 records."""
    from bench.run.config import cuda_device_count
    from bench.launch.task import (launch_task_rank, no_requeue_on_time_limit_warning, since_process_start,
                              task_rank_environment)

    no_requeue_on_time_limit_warning()
    env = task_rank_environment(int(cfg.world_size))
    rank, ntasks = env["rank"], env["tasks"]
    if ntasks == 1 and int(cfg.world_size) > 1:  # one task for all ranks: torch elastic inside the allocation
        return run(cfg, run_dir, command, t0, explicit)
    if holds_completed(run_dir):  # every rank reads the same (metrics.json is written last)
        log.error("%s already holds a completed result: not running into it", run_dir)
        return "refused"
    raw, base, plan, err = plan_run(cfg, run_dir, explicit, gpus=cuda_device_count() * env["nodes"])
    base["submitit_job_id"] = env["job_id"]
    base["process_start_s"] = since_process_start(t0)  # task process start -> task function (not in startup_s)
    if rank == 0:
        write_status(run_dir, "running", **base)
    if ntasks != int(cfg.world_size):
        err = ConfigError("world_size", cfg.world_size, f"the job has {ntasks} tasks (one per rank is needed); "
                          "use hydra/launcher=slurm, which sizes each job by its world_size")
    if err is not None:
        return record_invalid(run_dir, raw, base, err, t0) if rank == 0 else "invalid"
    plan.command = command
    if rank == 0:
        log.info("run %s: %s, rank %d of %d (%d node(s)), master %s:%s", run_dir, env["describe"], rank, ntasks,
                 env["nodes"], os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])
    return launch_task_rank(plan, run_dir, rank, lambda o: finish(run_dir, raw, o.status, o.error, o.failures, base, t0,
                                                                        plan))


def dry_run(cfg: DictConfig, run_dir: Path, explicit: Iterable[str] = ()) -> str:
    """dry_run=true: validate, print and write the memory plan (run_dir/plan.json); start no process."""
    from bench.plan.memory_model import fits

    raw, base, plan, err = plan_run(cfg, run_dir, explicit)
    if err is not None:
        log.error("%s", err)
        return "invalid"
    mem = plan.memory
    verdict = fits(mem, plan)
    lay = mem["layout"]
    log.info("plan: model=%s (%s parameters, %.3g GFLOP/token) strategy=%s world_size=%d tp=%d pp=%d dp=%d%s "
             "micro-batch %d x %d, recompute=%s; %s%s", plan.model.name, count_text(mem["parameters"]),
             mem["flops_per_token"] / 1e9, plan.strategy.name, plan.world_size, lay["tp"], lay["pp"], lay["dp"],
             f" cp={lay['cp']}" if "cp" in lay else "", lay["micro_batch_size"], lay["microbatches"], lay["recompute"],
             mem["summary"],
             f" -> would be skipped: {verdict}; {way_out(plan)}" if verdict else "")
    log_choices(plan)
    from bench.plan.prediction_text import predicted, prediction_line

    pred = None if verdict else predicted(plan)  # a plan that cannot run has no throughput to state
    log.info("%s", "prediction: none (the plan does not fit: it cannot run)" if verdict else prediction_line(pred, plan))
    nearest = auto_way_out(cfg, run_dir, explicit) if verdict and plan.micro_batch_auto is None else None
    write_json_atomic(run_dir / "plan.json", {"key": base["key"], "config": plan.cfg, "memory": mem,
                                              "tuning": plan.tuning, "micro_batch_size_auto": plan.micro_batch_auto,
                                              "fits": verdict is None, "prediction": pred,
                                              "with_micro_batch_size_auto": nearest})
    return "skipped" if verdict else "planned"


def auto_way_out(cfg: DictConfig, run_dir: Path, explicit: Iterable[str]) -> Optional[dict]:
    """A plan that does not fit at the micro-batch it was given: the same run with strategy.micro_batch_size=auto
    (the micro-batch, recompute and sharding knobs chosen to fit), planned and predicted, so the way out is a
    setting with its numbers rather than advice; None when it cannot be planned."""
    from bench.plan.memory_model import fits
    from bench.plan.prediction_text import predicted, prediction_line

    auto = cfg.copy()
    auto.strategy.micro_batch_size = "auto"
    _, _, plan, err = plan_run(auto, run_dir, [*explicit, "strategy.micro_batch_size"])
    if err is not None or plan is None:
        return None
    verdict, a = fits(plan.memory, plan), plan.micro_batch_auto or {}
    pred = None if verdict else predicted(plan)
    lay = plan.memory["layout"]
    log.info("with strategy.micro_batch_size=auto: micro-batch %d x %d, recompute=%s: %s; %s", lay["micro_batch_size"],
             lay["microbatches"], lay["recompute"], plan.memory["summary"],
             f"does not fit either ({verdict})" if verdict else prediction_line(pred, plan))
    return {"micro_batch_size": lay["micro_batch_size"], "microbatches": lay["microbatches"],
            "recompute": lay["recompute"], "fits": verdict is None, "reason": a.get("reason"),
            "summary": plan.memory["summary"], "prediction": pred}


def way_out(plan: Plan) -> str:
    """What to try when a plan does not fit: micro_batch_size=auto (unless it chose this), then the planner."""
    planner = ("python -m bench.planner with the same model, hardware and world_size searches every strategy, "
               "tp / pp, micro-batch, recompute and precision for the fastest layout that fits")
    if plan.micro_batch_auto is not None:
        return f"strategy.micro_batch_size=auto found no micro-batch that fits this layout; {planner}"
    return (f"strategy.micro_batch_size=auto chooses the micro-batch, recompute and sharding knobs that fit (with "
            f"gradient accumulation for the rest of the batch); {planner}")


def log_choices(plan: Plan) -> None:
    """What tuning=best applied (and from which measured workload), what micro_batch_size=auto chose, and a CPU
    precision that will crawl (bench/machine/hardware_rules.py slow_cpu_precision)."""
    from bench.machine.hardware_rules import slow_cpu_precision

    slow = slow_cpu_precision(plan.device, plan.run.precision)
    if slow:
        log.warning("note: %s", slow)
    if plan.tuning:
        log.info("tuning=%s: %s", plan.tuning["profile"], plan.tuning["summary"])
    if plan.micro_batch_auto:
        a = plan.micro_batch_auto
        log.info("strategy.micro_batch_size=auto: %d (x %d micro-batches of the per-rank batch %d): %s", a["chosen"],
                 a["grad_accum"], a["per_rank_batch"], a["reason"])


def exit_code(status: str) -> int:
    return {"completed": 0, "planned": 0, "invalid": 2, "skipped": 3, "interrupted": 130}.get(status, 1)

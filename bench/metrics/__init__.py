"""The metrics component: turns per-rank measurements into ``metrics.json``.

Every key of the schema is always present; what does not apply to a run is null.
Bump SCHEMA_VERSION when a key changes meaning or moves.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from bench.metrics import flops as _flops
from bench.machine.placement import summary as placement_summary
from bench.metrics.timing import step_time_stats
from bench.spec.schema import BenchConfig, ModelConfig, Plan

SCHEMA_VERSION = 1
# a run's final statuses; skipped: not launched, the memory plan predicted an out-of-memory (force_run=true runs it)
STATUSES = ("completed", "failed", "oom", "invalid", "skipped", "timeout", "interrupted")


def identity(cfg: dict) -> dict:
    """The columns that say what ran (flat): tables, the cost estimate, the sweep summary."""
    m, s = cfg.get("model") or {}, cfg.get("strategy") or {}
    return {
        "model": m.get("name"), "strategy": s.get("name"), "impl": s.get("impl"),
        "world_size": cfg.get("world_size"), "precision": cfg.get("precision"),
        "compile": cfg.get("compile"), "steps": cfg.get("steps"), "warmup_steps": cfg.get("warmup_steps"),
        "global_batch": m.get("global_batch"), "seq_len": m.get("seq_len"), "seed": cfg.get("seed"),
    }


def skeleton(cfg: dict, status: str, error: Optional[dict] = None) -> dict:
    """A metrics.json with every key present and every measurement null."""
    assert status in STATUSES, status
    return {
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "error": error,
        "run": {**identity(cfg), "device_type": None, "timed_steps": None},
        "layout": None,
        "throughput": {"tokens_per_step": None, "tokens_per_step_expected": None, "timed_window_s": None,
                       "applied_timed_steps": None, "tokens_timed": None, "tokens_per_s": None,
                       "tokens_per_s_per_device": None, "token_rule": None},
        "step_time_s": {"median": None, "mean": None, "p10": None, "p90": None, "min": None, "max": None,
                        "n": None, "all": None, "source": None},  # source: how steps were timed (worker.py)
        "loss": {"per_step": None, "first": None, "last": None, "ln_vocab": None},
        "skipped_steps": {"warmup": None, "timed": None},
        "flops": {"formula": _flops.FORMULA, "N": None, "N_counts": _flops.N_COUNTS, "L": None, "d": None,
                  "seq": None, "flops_per_token": None, "total_params": None,
                  "achieved_tflops_per_device": None, "peak_tflops": None, "peak_source": None, "mfu": None,
                  "peak_tflops_fp8": None,  # precision=fp8: the device's float8 peak (MFU is against bf16's)
                  "matmul_peak_tflops_measured": None, "mfu_vs_measured_peak": None,
                  "hfu_formula": _flops.HFU_FORMULA, "recompute": cfg.get("recompute", "none"),
                  "hardware_flops_per_token": None, "hfu": None, "hfu_vs_measured_peak": None},
        "memory": {"max_allocated_mb": None, "max_reserved_mb": None, "nvml_used_peak_mb": None,
                   "nvml_used_mean_mb": None, "host_peak_rss_mb": None, "warmup_garbage_freed_mb": None,
                   "allocator": None, "plan": None},  # plan: bench/plan/memory_model.py
        "utilization": {"gpu_util_mean_pct": None},
        "energy": {"joules": None, "joules_per_token": None},
        "profile": None,  # metrics.profile_steps > 0: per rank, bench/metrics/profile.py
        "ranks": None,
        "placement": None,  # {"nodes": {node: [ranks]}, "master_addr", "master_port"} (bench/machine/placement.py)
        "config": cfg,
        "provenance": None,
    }


def _max(xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def assemble(plan: Plan, device_type: str, ranks: list[dict], describe: dict, provenance: dict,
             matmul_peak: Optional[float]) -> dict:
    """metrics.json of a completed run from the per-rank records (rank order); its config, the plan's record."""
    out = skeleton(plan.cfg, "completed")
    run = plan.run
    model = run.model
    warmup = run.warmup_steps
    timed = run.steps - warmup
    per_step = _loss_per_step(ranks, run.steps)
    skipped = ranks[0]["skipped"]
    applied_timed = _applied_timed_steps(skipped, warmup, timed)
    throughput = _throughput(ranks, model, run.world_size, applied_timed, describe)
    flops = _flops_fields(run, throughput["tokens_per_s"], ranks[0].get("device_name"), matmul_peak)
    # The run's step time is set by its slowest rank: take the per-step max over ranks.
    step_times = [max(r["step_times"][i] for r in ranks) for i in range(timed)]
    energy = [r["energy_j"] for r in ranks]

    out["run"].update(device_type=device_type, timed_steps=timed)
    out["layout"] = describe
    out["throughput"] = throughput
    out["step_time_s"] = {**step_time_stats(step_times), "all": step_times,
                          "source": ranks[0].get("step_time_source")}
    finite = [x for x in per_step if x is not None]
    out["loss"] = {"per_step": per_step, "first": finite[0] if finite else None,
                   "last": finite[-1] if finite else None, "ln_vocab": math.log(model.vocab_size)}
    out["skipped_steps"] = {"warmup": sum(skipped[:warmup]), "timed": sum(skipped[warmup:])}
    out["flops"].update(flops)
    out["memory"] = _memory(ranks, device_type)
    out["utilization"] = {"gpu_util_mean_pct": _mean(r["gpu_util_mean_pct"] for r in ranks)}
    total_j = sum(energy) if energy and all(e is not None for e in energy) else None
    out["energy"] = {"joules": total_j, "joules_per_token": total_j / throughput["tokens_timed"] if total_j else None}
    profiles = [r.get("profile") for r in ranks]
    out["profile"] = profiles if any(profiles) else None
    out["ranks"] = [{k: v for k, v in r.items() if k not in ("losses", "profile")} for r in ranks]
    out["placement"] = placement_summary([r.get("placement") for r in ranks])
    out["provenance"] = provenance
    return out


def _loss_per_step(ranks: list[dict], n_steps: int) -> list:
    """Loss per step: token-weighted mean over the ranks that hold a loss (DP: every rank; TP: one
    replica's first rank; PP: last stage)."""
    per_step = []
    for n in range(n_steps):
        num = den = 0.0
        for r in ranks:
            if r["losses"][n] is not None and r["tokens_per_step"] > 0:
                num += r["losses"][n] * r["tokens_per_step"]
                den += r["tokens_per_step"]
        per_step.append(num / den if den else None)
    return per_step


def _applied_timed_steps(skipped: list, warmup: int, timed: int) -> int:
    """The timed steps the optimizer applied (not skipped by the fp16 loss scaler); raises if none."""
    applied_timed = timed - sum(skipped[warmup:])
    if applied_timed == 0:  # no token was trained in the window: no throughput to report
        raise RuntimeError(f"every one of the {timed} timed steps was skipped by the fp16 loss scaler (gradient "
                           "overflow): nothing was trained in the timed window; raise warmup_steps so that the "
                           "loss scale settles before it, or use precision=bf16")
    return applied_timed


def _throughput(ranks: list[dict], model: ModelConfig, ws: int, applied_timed: int, describe: dict) -> dict:
    tokens_per_step = sum(r["tokens_per_step"] for r in ranks)
    window = max(r["window_s"] for r in ranks)
    tokens_timed = tokens_per_step * applied_timed
    tps = tokens_timed / window
    return {
        "tokens_per_step": tokens_per_step,
        "tokens_per_step_expected": model.global_batch * model.seq_len,
        "timed_window_s": window,
        "applied_timed_steps": applied_timed,
        "tokens_timed": tokens_timed,
        "tokens_per_s": tps,
        "tokens_per_s_per_device": tps / ws,
        "token_rule": describe.get("token_rule", "sum over ranks of each rank's counted tokens"),
    }


def _flops_fields(run: BenchConfig, tps: float, dev_name: Optional[str], matmul_peak: Optional[float]) -> dict:
    """The measured part of metrics.json's "flops" section: model and hardware FLOPs, MFU, HFU."""
    model, ws = run.model, run.world_size
    fpt = _flops.flops_per_token(model)
    achieved = fpt * tps / ws / 1e12
    peak, source = (run.metrics.peak_tflops, "config metrics.peak_tflops") \
        if run.metrics.peak_tflops else _flops.mfu_peak_tflops(dev_name, run.precision, run.tf32)
    fp8_peak = _flops.peak_tflops(dev_name, "fp8", False)[0] if run.precision == "fp8" else None
    hw_fpt = _flops.hardware_flops_per_token(model, run.recompute, run.recompute_every, run.loss_chunks)
    hw = hw_fpt * tps / ws / 1e12
    return dict(
        N=_flops.matmul_params(model), L=model.n_layers, d=model.d_model, seq=model.seq_len,
        flops_per_token=fpt, total_params=_flops.total_params(model),
        achieved_tflops_per_device=achieved, peak_tflops=peak, peak_source=source, peak_tflops_fp8=fp8_peak,
        mfu=achieved / peak if peak else None, matmul_peak_tflops_measured=matmul_peak,
        mfu_vs_measured_peak=achieved / matmul_peak if matmul_peak else None,
        hardware_flops_per_token=hw_fpt,
        hfu=hw / peak if peak else None, hfu_vs_measured_peak=hw / matmul_peak if matmul_peak else None)


def _memory(ranks: list[dict], device_type: str = "cpu") -> dict:
    from bench.metrics.memory import allocator_record, summarize

    own = {"reason": f"{device_type} run: no CUDA caching allocator"}
    if device_type == "cuda":  # assembled on rank 0 after its run: its own allocator, where the ranks lack theirs
        import torch

        own = allocator_record(torch.device("cuda", torch.cuda.current_device()), ranks[0].get("nvml_mem_used_peak_mb"))
    return {
        "allocator": summarize(ranks, own),  # bench/metrics/memory.py
        "max_allocated_mb": _max(r["max_allocated_mb"] for r in ranks),
        "max_reserved_mb": _max(r["max_reserved_mb"] for r in ranks),
        "nvml_used_peak_mb": _max(r["nvml_mem_used_peak_mb"] for r in ranks),
        "nvml_used_mean_mb": _mean(r["nvml_mem_used_mean_mb"] for r in ranks),
        "host_peak_rss_mb": _max(r["host_peak_rss_mb"] for r in ranks),
        # device memory in cyclic garbage that the warm-up freed (bench/launch/worker.py _collect_garbage)
        "warmup_garbage_freed_mb": _max(r.get("warmup_garbage_freed_mb") for r in ranks),
    }


def one_line(m: dict[str, Any]) -> str:
    """A compact human summary of a metrics.json."""
    r = m["run"]
    head = f"{r['model']}/{r['strategy']} ws={r['world_size']} {r['precision']}"
    if m["status"] != "completed":
        err = (m.get("error") or {}).get("message", "")
        return f"{head}: {m['status'].upper()} {err.splitlines()[0] if err else ''}"
    t, f, mem = m["throughput"], m["flops"], m["memory"]
    mfu = f"{100 * f['mfu']:.1f}%" if f["mfu"] is not None else "n/a"
    mfu_m = f" ({100 * f['mfu_vs_measured_peak']:.1f}% of measured matmul peak)" \
        if f["mfu_vs_measured_peak"] is not None else ""
    mem_s = f"{mem['max_allocated_mb']:.0f} MiB" if mem["max_allocated_mb"] is not None else \
        f"host RSS {mem['host_peak_rss_mb']:.0f} MiB"
    return (f"{head}: {t['tokens_per_s']:,.0f} tokens/s, step {1e3 * m['step_time_s']['median']:.1f} ms "
            f"(median of {m['step_time_s']['n']}), MFU {mfu}{mfu_m}, peak mem {mem_s}, "
            f"loss {m['loss']['first']:.4f} -> {m['loss']['last']:.4f}")

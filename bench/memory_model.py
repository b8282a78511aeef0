"""Predicted model-state memory per rank (ZeRO paper, Rajbhandari et al. 2020, section 3/5).

Model states = parameters + gradients + optimizer states; activations, communication buffers,
the allocator's fragmentation and the CUDA context are NOT included (compare this with
metrics' ``max_allocated_mb`` as a lower bound).  Psi = ``bench.metrics.flops.total_params``.

Per parameter, by where the master weights live:

* ``mixed`` (DeepSpeed bf16/fp16: 16-bit params and grads, fp32 master + Adam m, v in the
  optimizer): params 2, grads 2, optimizer K = 12 bytes.
* ``fp32`` (fp32 runs, and torch autocast over fp32 weights: single/DDP at bf16/fp16, ZeRO-0
  and ZeRO-3 with ``autocast=true``): params 4, grads 4, optimizer 8 (Adam m, v; the params
  are the master).
* ``autocast_copy`` (ZeRO-1/2 with ``autocast=true``, and any stage with autocast and
  optimizer offload): as ``fp32``, but DeepSpeed's ZeRO optimizer keeps its own fp32 copy of
  the partition it steps: optimizer 12.
* ``megatron_mixed`` (Megatron Float16Module, grad_reduce_in_fp32): params 2, grads 4 (fp32 main
  grads), optimizer 12; the distributed optimizer is ZeRO-1 (optimizer / dp).
* ``fsdp_mixed`` (FSDP2 MixedPrecisionPolicy: fp32 sharded params are the master, grads
  reduced into fp32 shards): params 4, grads 4, optimizer 8, plus the unsharded 16-bit
  parameters while they are gathered.

ZeRO stage s over dp ranks: stage >= 1 divides the optimizer by dp, >= 2 also the grads,
3 also the params.  FSDP2 maps to stage 3; with ``reshard_after_forward=false`` the gathered
(unsharded) parameters of every block stay alive from forward through backward, so the full
parameter copy is counted as well (ZeRO-2-like peak).  With reshard the transient is one unit
(``blocks_per_unit`` blocks), which is not counted.  Offload moves the optimizer states
(``offload_optimizer``/FSDP ``cpu_offload``) and, for ``offload_param`` / FSDP ``cpu_offload``,
the parameter shards to the host; FSDP ``cpu_offload`` also moves the gradient shards; DeepSpeed
optimizer offload keeps the 16-bit gradients on the device and adds an fp32 gradient partition
(4 Psi / dp) on the host.
Tensor/pipeline parallel plans are approximated by dividing Psi evenly over tp x pp.
"""
from __future__ import annotations

from typing import Any

from bench.metrics.flops import total_params

MB = 2**20
_PARTS = ("params", "grads", "optimizer")

# bytes per parameter: (params, grads, optimizer)
BYTES_PER_PARAM = {
    "mixed": (2, 2, 12),
    "fp32": (4, 4, 8),
    "autocast_copy": (4, 4, 12),
    "fsdp_mixed": (4, 4, 8),
    "megatron_mixed": (2, 4, 12),
}


def _plan_fields(plan: Any) -> tuple[dict, int, int, int]:
    """(cfg, dp, tp, pp) of a Plan or of its to_dict()."""
    if isinstance(plan, dict):
        return plan["cfg"], plan["dp_size"], plan.get("tp", 1), plan.get("pp", 1)
    return plan.cfg, plan.dp_size, plan.tp, plan.pp


def layout_of(cfg: dict) -> dict:
    """How the strategy of cfg holds its model states: dtype scheme, ZeRO stage, offloads."""
    s, prec = cfg["strategy"], cfg["precision"]
    name = s["name"]
    out = {"scheme": "fp32", "stage": 0, "offload_optimizer": False, "offload_param": False,
           "offload_grads": False, "host_fp32_grad_partition": False, "unsharded_params_live": False,
           "note": ""}
    if name == "zero":
        autocast = prec != "fp32" and s.get("autocast")
        scheme = "fp32" if prec == "fp32" else "mixed"
        if autocast:
            copy = s["zero_stage"] in (1, 2) or s["offload_optimizer"] != "none"
            scheme = "autocast_copy" if copy else "fp32"
        out.update(scheme=scheme, stage=s["zero_stage"],
                   offload_optimizer=s["offload_optimizer"] != "none",
                   host_fp32_grad_partition=s["offload_optimizer"] != "none",
                   offload_param=s["offload_param"] != "none",
                   note=f"DeepSpeed ZeRO-{s['zero_stage']}" + (" torch_autocast" if autocast else ""))
    elif name == "fsdp":
        reshard = s["reshard_after_forward"]
        out.update(scheme="fp32" if prec == "fp32" else "fsdp_mixed", stage=3,
                   offload_optimizer=s["cpu_offload"], offload_grads=s["cpu_offload"],
                   offload_param=s["cpu_offload"], unsharded_params_live=not reshard,
                   note="FSDP2 reshard_after_forward=%s (%s analogue)" % (reshard, "ZeRO-3" if reshard else "ZeRO-2"))
    elif s.get("impl") == "megatron":
        # Megatron (Float16Module + DDP with grad_reduce_in_fp32): 16-bit params, fp32 main grads,
        # fp32 main params + Adam m, v; the distributed optimizer shards the latter over dp
        # (Megatron's docs: 18 bytes/param, or 6 + 12/dp with the distributed optimizer).
        fp32_grads = s.get("grad_reduce_in_fp32", True)
        out.update(scheme="fp32" if prec == "fp32" else ("megatron_mixed" if fp32_grads else "mixed"),
                   stage=1 if s.get("use_distributed_optimizer") else 0,
                   note=f"megatron tp={s.get('tp', 1)} pp={s.get('pp', 1)}"
                        + (" distributed optimizer" if s.get("use_distributed_optimizer") else ""))
    else:
        out["note"] = (f"{name}: model states replicated over data-parallel ranks, torch optimizer over "
                       "fp32 weights"
                       + (" (autocast)" if prec != "fp32" else ""))
    return out


def predicted_model_state_bytes(plan: Any) -> dict:
    """Model-state bytes per rank predicted for a Plan (or Plan.to_dict()), on device and host.

    Returns {"psi", "scheme", "stage", "dp", "note", "formula",
             "device": {params, grads, optimizer, total}, "host": {...}, "total"}."""
    cfg, dp, tp, pp = _plan_fields(plan)
    psi_all = total_params(cfg["model"])
    psi = psi_all / (tp * pp)
    lay = layout_of(cfg)
    bp, bg, bo = BYTES_PER_PARAM[lay["scheme"]]
    stage = lay["stage"]
    size = {
        "params": bp * psi / (dp if stage >= 3 else 1),
        "grads": bg * psi / (dp if stage >= 2 else 1),
        "optimizer": bo * psi / (dp if stage >= 1 else 1),
    }
    where = {"params": "host" if lay["offload_param"] else "device",
             "grads": "host" if lay["offload_grads"] else "device",
             "optimizer": "host" if lay["offload_optimizer"] else "device"}
    device = {k: 0.0 for k in _PARTS}
    host = {k: 0.0 for k in _PARTS}
    for k in _PARTS:
        (host if where[k] == "host" else device)[k] += size[k]
    if lay["unsharded_params_live"]:
        # FSDP2 without reshard: every block's gathered compute-dtype params live through the step
        compute_bytes = 4 if lay["scheme"] == "fp32" else 2
        device["params"] += compute_bytes * psi
    if lay["host_fp32_grad_partition"]:
        # DeepSpeed optimizer offload: the 16-bit gradients stay on the device (per stage) and the
        # fp32 gradient partition the CPU optimizer steps on is kept on the host
        host["grads"] += 4 * psi / dp
    device = {k: int(round(v)) for k, v in device.items()}
    host = {k: int(round(v)) for k, v in host.items()}
    device["total"] = sum(device[k] for k in _PARTS)
    host["total"] = sum(host[k] for k in _PARTS)
    return {
        "psi": psi_all, "psi_per_tp_pp_shard": int(psi), "scheme": lay["scheme"], "stage": stage, "dp": dp,
        "tp": tp, "pp": pp, "note": lay["note"],
        "formula": "bytes/param (params, grads, optimizer) = %s; stage>=1: optimizer/dp, >=2: grads/dp, "
                   "3: params/dp" % (BYTES_PER_PARAM[lay["scheme"]],),
        "device": device, "host": host, "total": device["total"] + host["total"],
    }


def predicted_model_state_mb(plan: Any) -> dict:
    """The same prediction in MiB (2**20 bytes, like metrics' max_allocated_mb), rounded to 0.1."""
    b = predicted_model_state_bytes(plan)
    mb = lambda d: {k: round(v / MB, 1) for k, v in d.items()}  # noqa: E731
    return {**{k: b[k] for k in ("psi", "scheme", "stage", "dp", "tp", "pp", "note", "formula")},
            "device": mb(b["device"]), "host": mb(b["host"]), "total": round(b["total"] / MB, 1)}

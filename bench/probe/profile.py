"""The probe's numbers as a hardware profile: the fields of bench/machine/hardware.py's HardwareConfig that the memory
plan and the prediction read, ``source: probe``, and a ``probe`` record of what was measured, how, and what
was not (with why).  Written as a YAML that Hydra composes as ``hardware=<file name>`` when it lies in a
``hardware/`` folder of a ``--config-dir``."""
from __future__ import annotations

import datetime
import socket
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from bench.machine.hardware import check
from bench.probe.comm import link_gbps
from bench.spec.schema import ConfigError


def _r(x: Optional[float], digits: int = 4) -> Optional[float]:
    """Rounded to ``digits`` significant digits: a measurement's noise is far above that."""
    return None if x is None else float(f"{x:.{digits}g}")


def _rates(tflops: dict) -> str:
    return "; ".join(f"{part} " + " / ".join(f"{v:.4g}" for _, v in sorted(r.items())) for part, r in tflops.items())


def build(name: str, alone: dict, intra: Optional[dict], inter: Optional[dict], groups: Optional[dict],
          run: dict) -> dict:
    """The profile (module docstring) from rank 0's measurements, the curves (``groups``: the all-reduce over
    smaller groups of a node, bench/probe/comm.py subgroup_curves) and how the ranks ran."""
    facts, per_node = alone["facts"], run["gpus_per_node"]
    intra_gbps = link_gbps(intra) if intra else None
    inter_gbps = link_gbps(inter) if inter else None
    not_measured = {f"peak_tflops.{k}": why for k, why in alone["peaks_missing"].items()}
    if intra is None:
        not_measured["intra_node_gbps"] = ("one rank a node: probe with 2 or more (--world-size, or the launcher's "
                                           "ranks a node)")
    if inter is None:
        not_measured["inter_node_gbps"] = ("one node: run the probe under SLURM (srun, one task per GPU) or torchrun "
                                           "across nodes to measure it")
    peaks = {k: _r(alone["peaks"].get(k)) for k in ("fp32", "tf32", "bf16", "fp16", "fp8")
             if k in alone["peaks"] or k in alone["peaks_missing"]}
    largest = intra or inter
    link, link_how, nccl = intra_node_link(alone)
    return {
        "name": name, "source": "probe", "gpu": facts["name"], "memory_gib": _r(facts["memory_gib"]),
        "compute_capability": facts["compute_capability"], "peak_tflops": peaks,
        "hbm_gbps": _r(alone["copy_gbps"]), "intra_node_gbps": _r(intra_gbps), "intra_node_link": link,
        "inter_node_gbps": _r(inter_gbps), "gpus_per_node": per_node, "host_memory_gib": _r(alone["host_memory_gib"]),
        "attention": {k: _r(v) for k, v in alone["attention"].items() if k != "tflops" and v is not None},
        "probe": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(), "device": facts["name"], "torch": _torch_version(), **run,
            "measured": {
                "peak_tflops": f"TFLOP/s of an {run['sizes']['matmul_n']}^3 matmul per precision, the fastest "
                               f"loop of {run['sizes']['iters']} of {run['sizes']['repeats']} (a burst's clocks, as "
                               "the prediction's fit) (fp8: "
                               "torch._scaled_mm, e4m3 inputs, bf16 output)",
                "hbm_gbps": f"a copy of {run['sizes']['copy_mib']} MiB: (read + written bytes) / time",
                "attention": "causal scaled_dot_product_attention, forward, and backward (forward + backward "
                             f"less forward), at {' and '.join(map(str, run['sizes']['attention_seqs']))} tokens a "
                             f"sequence (TFLOP/s on the FLOPs a causal kernel runs: {_rates(alone['attention']['tflops'])}"
                             "), each fitted as share x the bf16 matmul peak (fp32 on a CPU) x seq / (seq + seq_half)",
                "intra_node_gbps": "all-reduce bus bandwidth at the largest message, ranks of one node"
                                   + ("" if intra else " (not measured)"),
                "inter_node_gbps": "all-reduce bus bandwidth at the largest message, all ranks of all nodes "
                                   "(send/recv: a ring whose every hop crosses nodes)"
                                   + ("" if inter else " (not measured)"),
                "intra_node_link": link_how,
                "memory_gib": facts.get("memory_note", "torch.cuda.get_device_properties().total_memory"),
                "largest_message_bytes": largest["all_reduce"][-1]["bytes"] if largest else None,
                "intra_node_groups": "all-reduce bus bandwidth over groups of 2, 4, ... ranks of one node: the "
                                     "first group with the node's other ranks idle (alone), and the slowest group "
                                     "with every group measuring at once (together)"
                                     + ("" if groups else " (not measured: fewer than 4 ranks a node)"),
            },
            "not_measured": not_measured, "host_cost": alone["host"], "nccl": nccl,
            "curves": {"intra_node": intra, "inter_node": inter, "intra_node_groups": groups or None},
        },
    }


def intra_node_link(alone: dict) -> tuple[str, str, dict]:
    """(intra_node_link, how it was found, the NCCL record): the link NCCL's log says it used (bench/machine/link_regime.py:
    P2P over an active NVLink = nvlink, P2P without = pcie, SHM = shm, NET = socket / ib), else NVML's guess."""
    nccl = alone.get("nccl") or {}
    if nccl.get("link"):
        return nccl["link"], (f"NCCL's INFO log of the collectives: connections per transport {nccl['transports']} "
                              f"(regime {nccl.get('regime')}); NVML: {alone['link_how']}"), nccl
    return alone["link"], alone["link_how"] + (f"; {nccl['transports_note']}" if nccl.get("transports_note") else ""), nccl


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def write(path: str, profile: dict) -> None:
    """The YAML, with a header that says how to use it; then one line on stdout saying where and whether it
    passes the check every hardware passes (bench/machine/hardware.py: a field the probe could not measure fails it)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    use = usage(p)
    head = (f"# hardware profile measured by python -m bench.probe on {profile['probe']['host']}, "
            f"{profile['probe']['date']}\n# {use}\n")
    p.write_text(head + OmegaConf.to_yaml(OmegaConf.create(profile)))
    try:
        check(profile)
        verdict = "complete"
    except ConfigError as e:
        verdict = f"INCOMPLETE, bench will refuse it until you set the field: {e}"
    peaks = ", ".join(f"{k} {v:g}" for k, v in profile["peak_tflops"].items() if v is not None)
    groups = profile["probe"]["curves"].get("intra_node_groups") or {}
    smaller = "".join(f"; groups of {g}: alone {c['alone'][-1]['busbw_gbps']:g}, all at once "
                      f"{c['together'][-1]['busbw_gbps']:g} GB/s" for g, c in groups.items())
    print(f"probe: wrote {p} ({verdict}); TFLOP/s {peaks}; memory {profile['hbm_gbps']:g} GB/s; intra-node "
          f"{profile['intra_node_gbps']} GB/s ({profile['intra_node_link']}){smaller}; inter-node "
          f"{profile['inter_node_gbps']} GB/s\nprobe: {use}", flush=True)


def usage(p: Path) -> str:
    """How ``hardware=`` reaches the file: Hydra finds group options in ``<config dir>/hardware/<name>.yaml``."""
    if p.parent.name == "hardware":
        return f"plan with it: python -m bench --config-dir {p.parent.parent.resolve()} hardware={p.stem} dry_run=true"
    return (f"to plan with it, put it in a folder named hardware/ (DIR/hardware/{p.stem}.yaml) and run python -m "
            f"bench --config-dir DIR hardware={p.stem} dry_run=true")

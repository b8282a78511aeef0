"""Where the probe's ranks come from and what each does.

Started here: ``--world-size`` local ranks by torch.multiprocessing (NCCL on GPUs, gloo on CPU).  Started
by a launcher: torchrun (RANK / WORLD_SIZE set) or SLURM's srun with one task per rank (submitit's
TorchDistributedEnvironment exports torch's variables from SLURM's), across nodes too.  Rank 0 measures
its device alone while the others wait; then each node's ranks measure the collectives inside their node
together, and with several nodes all ranks measure them across nodes.  Rank 0 writes the profile.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
import warnings
from typing import Optional

import torch
import torch.distributed as dist

from bench.machine import link_regime
from bench.probe import comm, measure
from bench.probe.profile import build, write


def launched_world() -> Optional[int]:
    """The world size a launcher gave this process (torchrun, or srun with more than one task), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ:
        import submitit

        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        return int(os.environ["WORLD_SIZE"])
    return None


def run_rank(index: int, opts: dict) -> None:
    """One rank: ``index`` is the local rank when started here; a launcher's RANK / LOCAL_RANK win."""
    # torch renames the gather / scatter calls between versions (comm.py takes what is there): not the user's concern
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    rank = int(os.environ.get("RANK", index))
    world = int(os.environ.get("WORLD_SIZE", opts["world_size"]))
    local = int(os.environ.get("LOCAL_RANK", index))
    # a task may see one GPU only (srun --gpus-per-task): its local rank then indexes past the visible ones
    cuda = opts["device"] == "cuda"
    device = torch.device("cuda", local % torch.cuda.device_count()) if cuda else torch.device("cpu")
    link_regime.apply(opts.get("regime", "default"), opts["nccl_dir"], rank, nccl=cuda)  # before NCCL starts
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)  # no guessing of the GPU
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _measure_and_write(rank, world, device, opts)
    finally:
        dist.destroy_process_group()


def _node_id() -> str:
    """This rank's node: the launcher's node index (SLURM_NODEID, torchrun's GROUP_RANK), else the host name."""
    return os.environ.get("SLURM_NODEID") or os.environ.get("GROUP_RANK") or socket.gethostname()


def _nodes(world: int) -> list[list[int]]:
    """The ranks of each node, in rank order: placement as it is, whatever the launcher."""
    hosts: list = [None] * world
    dist.all_gather_object(hosts, _node_id())
    names = list(dict.fromkeys(hosts))
    return [[r for r in range(world) if hosts[r] == h] for h in names]


def _across(nodes: list[list[int]]) -> list[int]:
    """All ranks, interleaved by node (n0r0, n1r0, n0r1, ...): each hop of the send/recv ring crosses nodes."""
    return [rs[i] for i in range(max(map(len, nodes))) for rs in nodes if i < len(rs)]


def _measure_and_write(rank: int, world: int, device: torch.device, opts: dict) -> None:
    s = measure.sizes(device, opts["quick"])
    alone = _alone(device, s) if rank == 0 else None
    dist.barrier()
    nodes = _nodes(world)
    groups = [dist.new_group(rs) for rs in nodes]  # every rank creates every group, in the same order
    smaller = {(g, rs[i]): dist.new_group(rs[i:i + g]) for rs in nodes for g in comm.subgroup_sizes(len(rs))
               for i in range(0, len(rs), g)}
    mine = next(i for i, rs in enumerate(nodes) if rank in rs)
    intra = comm.curves(nodes[mine], groups[mine], device, s) if len(nodes[mine]) > 1 else None
    sub = comm.subgroup_curves(nodes[mine], groups[mine], smaller, device, s) if intra is not None else None
    inter = comm.curves(_across(nodes), None, device, s) if len(nodes) > 1 else None
    dist.barrier()  # every rank's connections made (and logged) before rank 0 reads NCCL's logs
    if rank == 0:
        alone["nccl"] = link_regime.record(Path(opts["nccl_dir"]).glob("nccl_rank*.log"), dist.get_backend(),
                                           alone["link"] == "nvlink" if device.type == "cuda" else None)
        per_node = len(nodes[0]) if device.type != "cuda" else max(torch.cuda.device_count(), len(nodes[0]))
        profile = build(opts["name"], alone, intra, inter, sub, {
            "world_size": world, "nodes": len(nodes), "ranks_per_node": [len(r) for r in nodes],
            "gpus_per_node": per_node, "backend": dist.get_backend(), "quick": opts["quick"],
            "sizes": s.record(), "launcher": opts.get("launcher", "torch.multiprocessing")})
        write(opts["out"], profile)
    dist.barrier()


def _alone(device: torch.device, s: measure.Sizes) -> dict:
    """What rank 0 measures on its own device (bench/probe/measure.py)."""
    peaks, missing = measure.matmul_peaks(device, s)
    link, link_how = measure.gpu_link(device)
    return {"facts": measure.device_facts(device), "peaks": peaks, "peaks_missing": missing,
            "attention": measure.attention_rate(device, s, peaks.get("bf16" if device.type == "cuda" else "fp32")),
            "copy_gbps": measure.copy_gbps(device, s), "host": measure.host_costs(device, s),
            "host_memory_gib": measure.host_memory_gib(), "link": link, "link_how": link_how}

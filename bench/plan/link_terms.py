"""The step's link terms before any fitted constant: seconds on the host link (offload), and how a link figure is
read (a datasheet's, or NCCL's bus bandwidth on a probe's measured curves), and whether a link regime's hardware
describes its link.  Part of bench/plan/predict.py's terms."""
from __future__ import annotations

from typing import Optional

import numpy as np

from bench.machine.hardware import HardwareConfig
from bench.plan.topology import KIND_GROUP, Topology
from bench.spec.schema import Plan

HOST_LINK_GBPS = 25.0  # host <-> device over PCIe (offload), one direction, achieved
# offload_activations' pinned copies on the compute stream reach this share of the host link's wire rate (PCIe's
# packet headers and flow control: 55.3 of 63 GB/s both ways on an H200, benchmarks/host_link.py,
# results/2026-12-02-h200x1-activation-offload); a profile or preset without the link: PCIe 4.0's
PINNED_COPY_SHARE, DEFAULT_HOST_LINK_GBPS = 0.88, 31.5
# the byte kinds (bench/costs/traffic.py) that travel over a node's link, read on the probe's curves
LINK_KINDS = ("grad_reduce", "param_gather", "tail", "activation", "p2p", "context", "embedding_grad")


def host_link_s(plan: Plan, hw: HardwareConfig, traffic: dict, mem: dict) -> float:
    """Seconds on the host link in a step, not hidden: the strategy's offloaded states (at HOST_LINK_GBPS, as its
    library moves them), and offload_activations' saved tensors of every micro-batch, out in the forward and back
    in the backward, pinned copies at PINNED_COPY_SHARE of the GPU's host link."""
    pinned = PINNED_COPY_SHARE * (hw.host_link_gbps or DEFAULT_HOST_LINK_GBPS) * 1e9
    return (traffic.get("offload", 0.0) / (HOST_LINK_GBPS * 1e9)
            + 2 * mem["activations"]["offloaded_per_microbatch"] * plan.grad_accum / pinned)


def measured_link(hw: HardwareConfig, traffic: dict, topo: Optional[Topology] = None) -> dict[str, float]:
    """How the link figure is read: ``link_fitted`` 1 for a datasheet figure (link_eff, fitted on such runs,
    applies); 0 for one that is NCCL's bus bandwidth already (a probe's profile, a PCIe preset: bench/machine/hardware.py
    gives those as NCCL's), used as measured, times ``link_factor``: the probe's bus bandwidth (``link_curve``) at the
    step's typical message (its bytes over its collectives) over the figure (1 without a curve).  On a slow link
    NCCL reaches its figure at a bucket's size; NVLink does not (its losses are in link_eff).  Where the probe also
    measured smaller groups of a node (``group_curve``), each kind's bytes are read on the curve of the group they
    travel over (``topo``, bench/plan/topology.py), and the factor is their bytes over their summed seconds."""
    if hw.source != "probe" and hw.intra_node_link != "pcie":
        return {"link_fitted": 1.0, "link_factor": 1.0}
    curve = link_curve(hw)
    sent = {k: traffic.get(k, 0.0) for k in LINK_KINDS if traffic.get(k, 0.0)}
    calls = traffic.get("collectives", 0.0)
    if not curve or not hw.intra_node_gbps or not sent or not calls:
        return {"link_fitted": 0.0, "link_factor": 1.0}
    total = sum(sent.values())
    gbps = {k: on_curve(group_curve(hw, topo, k) or curve, total / calls) for k in sent}
    busbw = total / sum(b / gbps[k] for k, b in sent.items()) if len(set(gbps.values())) > 1 else gbps.popitem()[1]
    return {"link_fitted": 0.0, "link_factor": busbw / float(hw.intra_node_gbps)}


# collectives whose bus bandwidth a probe measures at the same message sizes (bench/probe/comm.py COLLECTIVES)
SAME_LINK_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def link_curve(hw: HardwareConfig) -> list[dict]:
    """The probe's bus-bandwidth curve of the node's link: its all-reduce's, and on a slow link (shared memory,
    PCIe, sockets: LINK_REGIME) the median of the three collectives' figures at each size.  NCCL's bus bandwidth
    puts a ring all-reduce, reduce-scatter and all-gather on one scale, the rate of the link they share; where that
    link is the bottleneck they are three readings of it (with peer-to-peer off they agree within 12% from 16 MiB
    up), and a --quick probe's single reading moved: over sockets one all-reduce at 64 MiB read 1.86 GB/s beside a
    reduce-scatter and an all-gather of 2.19 and 2.15 in the same probe (results/2026-11-27-h100x4-slow-links-zero-tp).
    Over NVLink they differ by NCCL's algorithm (a reduce-scatter of 16 MiB at 83 GB/s beside an all-reduce at 229:
    results/2026-11-27-h100x4-slow-links), so there the all-reduce's curve is read alone."""
    intra = ((hw.probe or {}).get("curves") or {}).get("intra_node") or {}
    curve = intra.get("all_reduce") or []
    if hw.intra_node_link not in LINK_REGIME:
        return curve
    by_size = [{p["bytes"]: p["busbw_gbps"] for p in intra.get(name) or []} for name in SAME_LINK_COLLECTIVES]
    return [{"bytes": p["bytes"], "busbw_gbps": float(np.median([c[p["bytes"]] for c in by_size if p["bytes"] in c]))}
            for p in curve]


def group_curve(hw: HardwareConfig, topo: Optional[Topology], kind: str) -> Optional[list[dict]]:
    """The probe's all-reduce curve over a smaller group of a node (bench/probe/comm.py subgroup_curves) for the
    group bytes of ``kind`` travel over, where it measured one of that size: ``alone`` when the plan's ranks on a
    node are that one group (a run on fewer GPUs than the node has), ``together`` when several groups of that size
    share the node; None for a group of the whole node, one spanning nodes, or a size not measured."""
    groups = ((hw.probe or {}).get("curves") or {}).get("intra_node_groups") or {}
    if topo is None or not groups:
        return None
    g = topo.groups[KIND_GROUP[kind]]
    if g.nodes > 1 or str(g.size) not in groups:
        return None
    # topo.gpus_per_node: the plan's ranks on one node (fewer than the node's GPUs on a small run)
    return groups[str(g.size)]["alone" if topo.gpus_per_node == g.size else "together"] or None


def on_curve(curve: list[dict], message: float) -> float:
    """Bus bandwidth at ``message`` bytes: log-linear between the probe's measured sizes, flat beyond them."""
    sizes = np.log([p["bytes"] for p in curve])
    return float(np.interp(np.log(max(message, 1.0)), sizes, [p["busbw_gbps"] for p in curve]))


# a link a profile or preset names -> the link regime that stands in for it (bench/machine/link_regime.py REGIMES)
LINK_REGIME = {"shm": "p2p_off", "pcie": "p2p_off", "socket": "sockets"}


def regime_mismatch(regime: Optional[str], hw: HardwareConfig) -> Optional[str]:
    """Why a plan under link regime ``regime`` (NCCL kept off its own link) cannot be predicted on ``hw``: the
    hardware describes another link (an NVLink preset's 450 GB/s for a run through sockets at about 2.5), so every
    communication term would be off by the ratio.  None where it matches: a probe profile measured under the regime,
    or hardware whose link the regime stands in for (LINK_REGIME: a PCIe preset for p2p_off)."""
    regime = regime or "default"
    probed = (((hw.probe or {}).get("nccl") or {}).get("regime")) if hw.source == "probe" else None
    if regime == "default" or probed == regime or LINK_REGIME.get(hw.intra_node_link or "") == regime:
        return None
    return (f"keeps NCCL off its own link, and hardware={hw.name} describes "
            f"{'a probe under regime ' + probed if probed else 'its ' + str(hw.intra_node_link)} link "
            f"({hw.intra_node_gbps} GB/s): no prediction can be made for it; plan with a probe of the regime (python -m "
            f"bench.probe --regime {regime} --out DIR/hardware/NAME.yaml, then --config-dir DIR hardware=NAME)")

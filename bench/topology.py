"""Where a plan's parallel groups live on nodes, and the bandwidth a collective over each group gets.

Ranks fill nodes in blocks (node k holds ranks k x gpus_per_node and up: torchrun's node ranks, SLURM's block
distribution, bench/launch/slurm), and the layout's rank order (bench/layout.py, Megatron-core's default
tp-dp-pp) puts tensor parallelism innermost, then data parallelism, then pipeline stages outermost: a TP group
stays inside a node unless tp > gpus_per_node; data parallelism spans nodes before pipeline stages do.

A collective over a group with ``g`` ranks on each of ``N`` nodes is costed as the hierarchical all-reduce
(reduce-scatter inside the node, all-reduce of 1/g of the data across nodes, all-gather inside; Horovod's
hierarchical allreduce, NCCL's ring bound by its slowest hop).  The ring bytes one rank sends, ``B (n - 1) / n``
per all-gather / reduce-scatter phase, take ``(g-1)/g / intra + (N-1)/(N g) / network`` seconds per byte of B,
where ``network`` is one GPU's share of its node's adapters (every GPU of a node takes part in its own data-parallel
group at once).  Inside one node that is the intra-node bandwidth, with g = 1 the network share; nccl-tests calls it
the bus bandwidth.  Pipeline sends cross nodes only at the stage boundaries between nodes; the step waits for the
slowest, so a pipeline group that spans nodes sends at the network share.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bench.hardware import HardwareConfig
from bench.layout import Layout

DEFAULT_LINK_GBPS = 25.0  # a preset without link figures (a bare hardware.name): what the prediction assumed before
GROUPS = ("tp", "dp", "pp")  # the layout's dimensions (bench/layout.py Coord)
# what each kind of bytes (bench/traffic.py BYTE_KINDS) travels over; offload goes to the host, not a group
KIND_GROUP = {"grad_reduce": "dp", "param_gather": "dp", "tail": "dp", "activation": "tp", "p2p": "pp"}


@dataclass(frozen=True)
class Group:
    """One kind of parallel group: its size, the nodes its widest instance spans, its fewest ranks on one node."""

    name: str
    size: int
    nodes: int
    per_node: int

    @property
    def where(self) -> str:
        return "inside a node" if self.nodes == 1 else f"across {self.nodes} nodes ({self.per_node} a node)"


@dataclass(frozen=True)
class Topology:
    """The nodes a plan runs on, its groups' placement and the two bandwidths (GB/s, one direction)."""

    nodes: int
    gpus_per_node: int
    intra_gbps: float
    network_gbps: float  # one GPU's share of its node's adapters
    groups: dict

    def bus_gbps(self, group: str) -> float:
        """Bus bandwidth of a ring collective over ``group`` (module docstring): intra-node, network, or between."""
        g = self.groups[group]
        if g.nodes == 1 or g.size == 1:
            return self.intra_gbps
        if group == "pp":
            return self.network_gbps
        n, inner, nodes = g.size, g.per_node, g.nodes
        # Horovod's NCCLHierarchicalAllreduce (horovod/common/ops/nccl_operations.cc): reduce-scatter in the node,
        # all-reduce of the 1/g shard across nodes, all-gather in the node; each phase its ring's bytes / bandwidth
        seconds = (inner - 1) / inner / self.intra_gbps + (nodes - 1) / (nodes * inner) / self.network_gbps
        return (n - 1) / n / seconds

    def kind_bytes_per_s(self, kind: str) -> float:
        """Bytes/s at which the bytes of a traffic kind (bench/traffic.py) move."""
        return self.bus_gbps(KIND_GROUP[kind]) * 1e9

    def describe(self) -> str:
        """One line for the plan: the nodes and where each group of more than one rank lives."""
        placed = [f"{name}={g.size} {g.where}" for name, g in self.groups.items() if g.size > 1]
        net = f", network {self.network_gbps:g} GB/s a GPU" if self.nodes > 1 else ""
        return (f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.gpus_per_node} GPUs (intra-node "
                f"{self.intra_gbps:g} GB/s{net}); " + ("; ".join(placed) or "one rank"))

    def as_dict(self) -> dict:
        """For plan.json: the nodes and each group's size, nodes spanned and bus bandwidth."""
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "intra_node_gbps": self.intra_gbps,
                "network_gbps_per_gpu": self.network_gbps,
                "groups": {k: {"size": g.size, "nodes": g.nodes, "per_node": g.per_node,
                               "bus_gbps": self.bus_gbps(k)} for k, g in self.groups.items()}}


def network_gbps(hw: HardwareConfig) -> Optional[float]:
    """One GPU's network share: the node's adapters split over its GPUs where described, else inter_node_gbps."""
    if hw.nics_per_node and hw.nic_gbps and hw.gpus_per_node:
        return hw.nics_per_node * hw.nic_gbps / hw.gpus_per_node
    return hw.inter_node_gbps


def _group(layout: Layout, name: str, per_node: int) -> Group:
    """The widest instance of a group kind: ranks sharing every other coordinate, on blocks of per_node ranks."""
    members: dict[tuple, list[int]] = {}
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        key = tuple(getattr(c, k) for k in GROUPS if k != name)
        members.setdefault(key, []).append(rank // per_node)
    spans, fewest = max((len(set(nodes_of)), -min(nodes_of.count(n) for n in set(nodes_of)))
                        for nodes_of in members.values())  # the most nodes, then the fewest ranks on one
    return Group(name, getattr(layout, name), spans, -fewest)


def topology(tp: int, pp: int, dp: int, hw: HardwareConfig) -> Topology:
    """Place a tp x pp x dp layout on nodes of ``hw.gpus_per_node`` GPUs (all on one node without that figure)."""
    layout = Layout(tp=tp, pp=pp, dp=dp)
    per_node = min(hw.gpus_per_node or layout.world_size, layout.world_size)
    intra = float(hw.intra_node_gbps or DEFAULT_LINK_GBPS)
    net = float(network_gbps(hw) or intra)
    nodes = -(-layout.world_size // per_node)
    return Topology(nodes, per_node, intra, net, {k: _group(layout, k, per_node) for k in GROUPS})

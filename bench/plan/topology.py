"""Where a plan's parallel groups live on nodes, and the bandwidth a collective over each group gets.

Ranks fill nodes in blocks (node k holds ranks k x gpus_per_node and up: torchrun's node ranks, SLURM's block
distribution, bench/launch/slurm), and the layout's rank order (bench/spec/layout.py, Megatron-core's default
tp-cp-dp-pp) puts tensor parallelism innermost, then context parallelism, then data parallelism, then pipeline stages
outermost: a TP group stays inside a node unless tp > gpus_per_node, a CP group next (tp x cp ranks in a row); data
parallelism spans nodes before pipeline stages do.

A collective over a group with ``g`` ranks on each of ``N`` nodes is costed as the hierarchical all-reduce
(reduce-scatter inside the node, all-reduce of 1/g of the data across nodes, all-gather inside; Horovod's
hierarchical allreduce, NCCL's ring bound by its slowest hop).  The ring bytes one rank sends, ``B (n - 1) / n``
per all-gather / reduce-scatter phase, take ``(g-1)/g / intra + (N-1)/(N g) / network`` seconds per byte of B,
where ``network`` is one GPU's share of its node's adapters (every GPU of a node takes part in its own data-parallel
group at once).  Inside one node that is the intra-node bandwidth, with g = 1 the network share; nccl-tests calls it
the bus bandwidth.  Pipeline sends cross nodes only at the stage boundaries between nodes; the step waits for the
slowest, so a pipeline group that spans nodes sends at the network share.

HSDP (``dp_replicate`` > 1) splits the data-parallel ranks into replicas (the outer index) of ``dp / dp_replicate``
adjacent shards (bench/parallel/mesh.py ``hsdp_mesh``): a shard group fills a node before a replica group spans
nodes.  Gradients and parameters travel over the shard group (the whole data-parallel group without replicas), the
replicas' all-reduce of each gradient shard (byte kind ``grad_replicate``) over the replicate group.

Context parallelism (cp > 1): the K / V exchange (byte kind ``context``) travels over the cp group; FSDP2 shards
over dp x cp (bench/parallel/mesh.py ``data_mesh``), so the data-parallel groups vary over cp too (with cp = 1 every
rank's cp coordinate is 0 and they are the groups above).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from bench.machine.hardware import HardwareConfig
from bench.spec.layout import Layout

DEFAULT_LINK_GBPS = 25.0  # a preset without link figures (a bare hardware.name): what the prediction assumed before
# each group kind by the rank coordinates its members differ in (the data-parallel one: replica and shard)
VARIES = {"tp": ("tp",), "dp": ("dp_replicate", "dp_shard", "cp"), "pp": ("pp",), "dp_shard": ("dp_shard", "cp"),
          "dp_replicate": ("dp_replicate",), "cp": ("cp",)}
HSDP_GROUPS = ("dp_shard", "dp_replicate")  # named in the plan only where there are replicas
# what each kind of bytes (bench/costs/traffic.py BYTE_KINDS) travels over; offload goes to the host, not a group
KIND_GROUP = {"grad_reduce": "dp_shard", "grad_replicate": "dp_replicate", "param_gather": "dp_shard", "tail": "dp",
              "activation": "tp", "p2p": "pp", "context": "cp", "embedding_grad": "pp"}
# the prediction's term a kind is part of: the replicas' all-reduce is issued in backward like the reduce-scatter
# before it, and hides behind the same compute; a pipeline's tied-embedding all-reduce comes after backward
KIND_TERM = {"grad_replicate": "grad_reduce", "embedding_grad": "tail"}


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
        """Bytes/s at which the bytes of a traffic kind (bench/costs/traffic.py) move."""
        return self.bus_gbps(KIND_GROUP[kind]) * 1e9

    def seconds(self, traffic: dict) -> dict[str, float]:
        """Seconds of a strategy's traffic (bench/costs/traffic.py) per prediction term, each kind at its group's speed."""
        out: dict[str, float] = {}
        for kind in KIND_GROUP:
            term = KIND_TERM.get(kind, kind)
            out[term] = out.get(term, 0.0) + traffic.get(kind, 0.0) / self.kind_bytes_per_s(kind)
        return out

    def shown(self) -> dict:
        """The groups a plan names: the shard and replicate groups only under HSDP (else they are the dp group), the
        cp group only with context parallelism."""
        hidden = set() if self.groups["dp_replicate"].size > 1 else set(HSDP_GROUPS)
        if self.groups["cp"].size == 1:
            hidden.add("cp")
        return {k: g for k, g in self.groups.items() if k not in hidden}

    def describe(self) -> str:
        """One line for the plan: the nodes and where each group of more than one rank lives."""
        cp = self.groups["cp"].size > 1  # the data-parallel groups span the cp ranks too: "dp x cp"
        placed = [f"{name}{' x cp' if cp and name != 'cp' and 'cp' in VARIES[name] else ''}={g.size} {g.where}"
                  for name, g in self.shown().items() if g.size > 1]
        net = f", network {self.network_gbps:g} GB/s a GPU" if self.nodes > 1 else ""
        return (f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.gpus_per_node} GPUs (intra-node "
                f"{self.intra_gbps:g} GB/s{net}); " + ("; ".join(placed) or "one rank"))

    def as_dict(self) -> dict:
        """For plan.json: the nodes and each group's size, nodes spanned and bus bandwidth."""
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node, "intra_node_gbps": self.intra_gbps,
                "network_gbps_per_gpu": self.network_gbps,
                "groups": {k: {"size": g.size, "nodes": g.nodes, "per_node": g.per_node,
                               "bus_gbps": self.bus_gbps(k)} for k, g in self.shown().items()}}


def network_gbps(hw: HardwareConfig) -> Optional[float]:
    """One GPU's network share: the node's adapters split over its GPUs where described, else inter_node_gbps."""
    if hw.nics_per_node and hw.nic_gbps and hw.gpus_per_node:
        return hw.nics_per_node * hw.nic_gbps / hw.gpus_per_node
    return hw.inter_node_gbps


def _coords(layout: Layout, rank: int, shard: int) -> dict:
    """A rank's coordinates, its data-parallel index split into (replica, shard): replicas are the outer index."""
    c = layout.coords(rank)
    return {"tp": c.tp, "pp": c.pp, "dp_replicate": c.dp // shard, "dp_shard": c.dp % shard, "cp": c.cp}


def _group(coords: list[dict], name: str, per_node: int) -> Group:
    """The widest instance of a group kind: ranks sharing every other coordinate, on blocks of per_node ranks."""
    members: dict[tuple, list[int]] = {}
    for rank, c in enumerate(coords):
        key = tuple(v for k, v in c.items() if k not in VARIES[name])
        members.setdefault(key, []).append(rank // per_node)
    spans, fewest = max((len(set(nodes_of)), -min(nodes_of.count(n) for n in set(nodes_of)))
                        for nodes_of in members.values())  # the most nodes, then the fewest ranks on one
    return Group(name, len(next(iter(members.values()))), spans, -fewest)


def topology(tp: int, pp: int, dp: int, hw: HardwareConfig, dp_replicate: int = 1, cp: int = 1) -> Topology:
    """Place a tp x cp x dp x pp layout (dp as dp_replicate replicas of shards) on nodes of ``hw.gpus_per_node`` GPUs
    (all on one node without that figure)."""
    layout = Layout(tp=tp, pp=pp, dp=dp, cp=cp)
    if dp % dp_replicate:
        raise ValueError(f"dp_replicate={dp_replicate} does not divide dp={dp}")
    per_node = min(hw.gpus_per_node or layout.world_size, layout.world_size)
    intra = float(hw.intra_node_gbps or DEFAULT_LINK_GBPS)
    net = float(network_gbps(hw) or intra)
    nodes = -(-layout.world_size // per_node)
    coords = [_coords(layout, r, dp // dp_replicate) for r in range(layout.world_size)]
    return Topology(nodes, per_node, intra, net, {k: _group(coords, k, per_node) for k in VARIES})

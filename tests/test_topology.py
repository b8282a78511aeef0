"""Topology in the prediction (bench/plan/topology.py): where a plan's groups live on nodes, and what their traffic costs.
The references are nccl-tests' bus bandwidth formulas (doc/PERFORMANCE.md: algbw = bytes / time; busbw = algbw x
2(n-1)/n for an all-reduce, x (n-1)/n for a reduce-scatter or all-gather), applied to message sizes computed here
from the model (its parameters counted on a meta-device build), not to the code's own byte counts."""
from __future__ import annotations

import pytest
import torch.distributed as dist
from hydra import compose, initialize_config_dir

from bench.run.config import register_configs, validate
from bench.spec.layout import Layout
from bench.models.model import build_model
from bench.parallel.mesh import build_mesh, hsdp_mesh
from bench.plan.predict import plan_topology, predict, terms
from bench.plan.topology import topology
from bench.machine.hardware import PRESETS
from tests.conftest import REPO

register_configs()
A100 = PRESETS["a100_80gb"]  # NVLink 300 GB/s inside a node, 25 GB/s of network a GPU, 8 GPUs a node


def plan_for(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=["dry_run=true", *overrides]), gpus=0)


def all_reduce_s(nbytes: float, n: int, busbw_gbps: float) -> float:
    """nccl-tests: busbw = algbw x 2(n-1)/n, algbw = bytes / time."""
    return nbytes / (busbw_gbps * 1e9 / (2 * (n - 1) / n))


def gather_s(nbytes: float, n: int, busbw_gbps: float) -> float:
    """nccl-tests: busbw = algbw x (n-1)/n for a reduce-scatter or an all-gather of ``nbytes`` (the whole)."""
    return nbytes / (busbw_gbps * 1e9 / ((n - 1) / n))


def nodes_of(layout: Layout, dim: str, per_node: int) -> set:
    """The nodes rank 0's group of ``dim`` runs on (ranks in node blocks), from the layout's own coordinates."""
    c0 = layout.coords(0)
    others = [k for k in ("tp", "pp", "dp") if k != dim]
    return {r // per_node for r in range(layout.world_size)
            if all(getattr(layout.coords(r), k) == getattr(c0, k) for k in others)}


@pytest.mark.parametrize("tp,pp,dp", [(8, 1, 2), (2, 1, 8), (2, 2, 4), (4, 4, 1), (16, 1, 1), (1, 1, 4)])
def test_groups_are_placed_where_the_layout_puts_their_ranks(tp, pp, dp):
    layout, topo = Layout(tp=tp, pp=pp, dp=dp), topology(tp, pp, dp, A100)
    assert topo.nodes == -(-layout.world_size // 8)
    for dim in ("tp", "pp", "dp"):
        assert topo.groups[dim].nodes == len(nodes_of(layout, dim, min(8, layout.world_size))), dim
    if tp <= 8:
        assert topo.groups["tp"].nodes == 1 and topo.bus_gbps("tp") == A100.intra_node_gbps


def test_two_nodes_megatron_tp8_keeps_tensor_parallelism_on_nvlink_and_pays_the_network_for_data_parallelism():
    """2 x 8 A100, TP=8, DP=2: each TP group is one node's 8 GPUs; each DP group is one GPU of each node."""
    base = ("model=llama3_1b", "strategy=megatron", "strategy.tp=8", "world_size=16", "model.global_batch=16",
            "hardware=a100_80gb")
    plan = plan_for(*base)
    two, one = terms(plan), terms(plan_for(*base, "hardware.gpus_per_node=16"))  # one node of 16, same NVLink
    m = plan.model
    message = plan.micro_batch_size * m.seq_len * m.d_model * 2  # bf16 activation all-reduced per layer pass
    passes = 4 * m.n_layers * plan.grad_accum  # two in forward, two in backward (Megatron's f / g)
    assert two["activation_s"] == pytest.approx(passes * all_reduce_s(message, 8, 300.0), rel=1e-9)
    assert two["activation_s"] == pytest.approx(one["activation_s"], rel=1e-12)  # TP never goes over the network
    dp_s = lambda t: t["grad_reduce_s"] + t["param_gather_s"] + t["tail_s"]  # noqa: E731
    # the same bytes between one GPU of each node: the 2-rank all-reduce's bus bandwidth is the GPU's network share
    assert dp_s(two) == pytest.approx(dp_s(one) * 300.0 / 25.0, rel=1e-9)
    assert "tp=8 inside a node" in plan_topology(plan).describe()
    assert "dp=2 across 2 nodes" in plan_topology(plan).describe()


@pytest.mark.parametrize("world,nics", [(8, None), (16, None), (16, (1, 25.0))])
def test_ddp_gradients_cost_the_hierarchical_all_reduce(world, nics):
    """DDP's fp32 gradient all-reduce: inside one node at NVLink's bus bandwidth; over two nodes reduce-scatter
    inside, all-reduce of an eighth across at the GPU's network share (the node's adapters over its 8 GPUs),
    all-gather inside."""
    over = ["model=10m", "strategy=ddp", f"world_size={world}", "model.global_batch=16", "hardware=a100_80gb"]
    if nics:
        over += [f"hardware.nics_per_node={nics[0]}", f"hardware.nic_gbps={nics[1]}"]
    plan = plan_for(*over)
    params = sum(p.numel() for p in build_model(plan.model, seed=0, device="meta").parameters())
    grads = 4.0 * params
    if world == 8:
        expected = all_reduce_s(grads, 8, 300.0)
    else:
        network = nics[0] * nics[1] / 8 if nics else 25.0
        expected = 2 * gather_s(grads, 8, 300.0) + all_reduce_s(grads / 8, 2, network)
    assert terms(plan)["grad_reduce_s"] == pytest.approx(expected, rel=1e-9)


def test_a_thin_network_slows_a_two_node_run_and_leaves_a_one_node_run_alone():
    two = ("model=300m", "strategy=ddp", "world_size=16", "model.global_batch=32", "hardware=a100_80gb")
    one = ("model=300m", "strategy=ddp", "world_size=8", "model.global_batch=16", "hardware=a100_80gb")
    thin = ("hardware.nics_per_node=1", "hardware.nic_gbps=25")
    assert predict(plan_for(*two, *thin))["tokens_per_s"] < predict(plan_for(*two))["tokens_per_s"]
    assert predict(plan_for(*one, *thin))["tokens_per_s"] == predict(plan_for(*one))["tokens_per_s"]


def mesh_groups(layout: Layout, replicate: int, rank: int) -> dict:
    """The ranks of ``rank``'s shard and replicate groups in the DeviceMesh an HSDP run builds (bench/parallel/mesh.py),
    from one rank's view of a fake process group of the layout's size."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    try:
        mesh = hsdp_mesh(build_mesh(layout, "cpu", rank), replicate)
        return {k: mesh[k].mesh.flatten().tolist() for k in ("dp_shard", "dp_replicate")}
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("tp,pp,dp,replicate", [(1, 1, 16, 2), (2, 1, 8, 2), (1, 2, 8, 4), (1, 1, 16, 8)])
def test_hsdp_groups_are_placed_where_the_runs_device_mesh_puts_their_ranks(tp, pp, dp, replicate):
    """Every rank's shard and replicate groups as the run's DeviceMesh makes them, on nodes of 8: the nodes each
    spans and its fewest ranks on one node are what the plan says (the groups of these layouts are alike)."""
    layout = Layout(tp=tp, pp=pp, dp=dp)
    topo = topology(tp, pp, dp, A100, replicate)
    seen: dict[str, set] = {"dp_shard": set(), "dp_replicate": set()}
    for rank in range(layout.world_size):
        for name, ranks in mesh_groups(layout, replicate, rank).items():
            nodes = [r // 8 for r in ranks]
            seen[name].add((len(ranks), len(set(nodes)), min(nodes.count(n) for n in set(nodes))))
    for name, placed in seen.items():
        g = topo.groups[name]
        assert placed == {(g.size, g.nodes, g.per_node)}, (name, placed, g)


# HSDP on 2 nodes x 8 A100 with one 25 Gb/s adapter's share a GPU: llama3_1b, 4 micro-batches of 1 a step
THIN = 3.125  # GB/s of network a GPU
HSDP_BASE = ("model=llama3_1b", "strategy=fsdp", "world_size=16", "model.global_batch=64",
             "strategy.micro_batch_size=1", "hardware=a100_80gb", f"hardware.inter_node_gbps={THIN}")


@pytest.mark.parametrize("replicate", [1, 2])
def test_hsdp_keeps_parameter_gathers_in_the_node_and_sends_only_the_gradient_shards_across(replicate):
    """Plain FSDP over 16 ranks gathers parameters and reduce-scatters gradients across both nodes (hierarchically:
    1/8 of each crosses); HSDP with a replica a node does both inside the node (the shard group is a node's 8 GPUs)
    and sends across only the all-reduce of each rank's 1/8 gradient shard, between the two GPUs holding it."""
    plan = plan_for(*HSDP_BASE, f"strategy.dp_replicate={replicate}")
    t = terms(plan)
    model = build_model(plan.model, seed=0, device="meta")
    params = sum(p.numel() for p in model.parameters())
    blocks = sum(p.numel() for p in model.blocks.parameters())
    grads = 4.0 * params  # fp32 reduce_dtype (the default)
    # bf16 gathers, every micro-batch: each unit for forward and (resharding) again for backward but the last unit,
    # the root (embeddings, final norm, head) once (tests/test_tp_traffic.py counts them on a real step)
    n, unit = plan.model.n_layers, plan.strategy.blocks_per_unit
    weights = 2.0 * ((params - blocks) + blocks * (1 + (n - unit) / n))
    gathers = plan.grad_accum
    assert plan.grad_accum == 4
    if replicate == 1:
        across = lambda b: gather_s(b, 8, 300.0) + gather_s(b / 8, 2, THIN)  # noqa: E731 (in the node, then 1/8 across)
        assert t["grad_reduce_s"] == pytest.approx(across(grads), rel=1e-9)
        assert t["param_gather_s"] == pytest.approx(gathers * across(weights), rel=1e-9)
        topo = plan_topology(plan)  # no replicas: the plan names the dp group alone
        assert "dp_shard" not in topo.describe() and "dp_replicate" not in topo.as_dict()["groups"]
    else:
        shard = grads / 8  # the gradient shard each rank holds after its node's reduce-scatter
        assert t["grad_reduce_s"] == pytest.approx(gather_s(grads, 8, 300.0) + all_reduce_s(shard, 2, THIN), rel=1e-9)
        assert t["param_gather_s"] == pytest.approx(gathers * gather_s(weights, 8, 300.0), rel=1e-9)
        where = plan_topology(plan).describe()
        assert "dp_shard=8 inside a node" in where and "dp_replicate=2 across 2 nodes (1 a node)" in where, where


def test_on_a_thin_network_hsdp_is_predicted_faster_than_fsdp():
    """Bytes one rank sends across nodes a step, in units of the parameter count: HSDP's all-reduce of its 1/8 of
    the fp32 gradient, 0.5; FSDP's 1/16 of the fp32 gradient and of each of 8 bf16 gathers, 0.25 + 8 x 0.125."""
    fsdp, hsdp = (predict(plan_for(*HSDP_BASE, f"strategy.dp_replicate={r}")) for r in (1, 2))
    assert hsdp["tokens_per_s"] > fsdp["tokens_per_s"], (hsdp["breakdown"], fsdp["breakdown"])
    assert hsdp["breakdown"]["exposed_comm_s"] < fsdp["breakdown"]["exposed_comm_s"], (hsdp, fsdp)

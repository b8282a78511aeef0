"""One DeviceMesh for the whole layout, in Megatron's rank order (bench/spec/layout.py)."""
from __future__ import annotations

from bench.spec.layout import DIMS, Layout


def build_mesh(layout: Layout, device_type: str, rank: int):
    """DeviceMesh of the layout's shape, dims named ``DIMS``; checked against bench.spec.layout's coordinates."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import init_device_mesh

    with unset_fake_temporarily():  # the mesh's rank table is real under FakeTensorMode (a memory estimate)
        mesh = init_device_mesh(device_type, layout.mesh_shape, mesh_dim_names=DIMS)
    c = layout.coords(rank)
    if list(mesh.get_coordinate()) != [getattr(c, d) for d in DIMS]:
        raise RuntimeError(f"DeviceMesh coordinate {mesh.get_coordinate()} of rank {rank} differs from "
                           f"bench.spec.layout's {c}")
    return mesh


def hsdp_mesh(mesh, replicate: int):
    """The "dp" dimension split into ("dp_replicate", "dp_shard") for FSDP2's HSDP (a 2-D mesh: shard over
    the inner dimension, replicate over the outer), as torchtitan's data_parallel_replicate_degree does.

    The replicas are the outer index, so a shard group is the dp ranks next to each other (inside a node
    when tp * dp_shard fits one) and only the replicas' all-reduce crosses nodes.  Unflattened from the
    same root mesh, so FSDP2 can still pair it with the "tp" dimension; every rank calls this (it creates
    the new dimensions' process groups)."""
    dp = mesh["dp"]
    if dp.size() % replicate:
        raise ValueError(f"dp_replicate={replicate} does not divide the data-parallel size {dp.size()}")
    return dp._unflatten(0, (replicate, dp.size() // replicate), ("dp_replicate", "dp_shard"))


def data_mesh(mesh, layout: Layout):
    """The mesh FSDP2 shards over: the dp dimension; with context parallelism dp x cp flattened (every rank of a
    replica's sequence shares the sharded states and averages its gradients, torchtitan's dp_shard_cp); with
    replicas (HSDP) the 2-D (dp_replicate, dp_shard) mesh, or (dp_replicate, dp_shard_cp)."""
    r = layout.dp_replicate
    if layout.cp > 1:  # dp-major, cp-minor: replica k holds the flat indices k * dp_shard * cp and up
        flat = mesh["dp", "cp"]._flatten("dp_cp")
        return flat if r == 1 else flat._unflatten(0, (r, flat.size() // r), ("dp_replicate", "dp_shard_cp"))
    return hsdp_mesh(mesh, r) if r > 1 else mesh["dp"]

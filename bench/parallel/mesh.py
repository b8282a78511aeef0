"""One DeviceMesh for the whole layout, in Megatron's rank order (bench/layout.py)."""
from __future__ import annotations

from bench.layout import Layout


def build_mesh(layout: Layout, device_type: str, rank: int):
    """DeviceMesh of shape (pp, dp, tp), dims named so; checked against bench.layout's coordinates."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, layout.mesh_shape, mesh_dim_names=("pp", "dp", "tp"))
    c = layout.coords(rank)
    if list(mesh.get_coordinate()) != [c.pp, c.dp, c.tp]:
        raise RuntimeError(f"DeviceMesh coordinate {mesh.get_coordinate()} of rank {rank} differs from "
                           f"bench.layout's {c}")
    return mesh

"""Context parallelism: each rank of a ``cp`` group holds 1/cp of every sequence, and attention sees the whole
sequence through PyTorch's own ring attention (``torch.distributed.tensor.experimental.context_parallel``: SDPA
replaced by a ring over the cp mesh, the sequence sharded head-tail so that every rank gets an equal share of the
causal work).  Token ids, targets and each token's position (rotary tables, learned position embeddings) are
sharded the same way, so positions stay right on every shard.  torchtitan's ``context_parallel`` step.

No CPU: PyTorch's ring runs only the CUDA attention kernels (flash, memory-efficient, cuDNN); CPU SDPA
(``_scaled_dot_product_flash_attention_for_cpu``) has no sharding rule, so validation refuses cp > 1 on CPU.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported by the run that shards: validation reads NO_CPU, and never imports torch
    import torch

# how K / V reach every rank: "allgather" (each layer gathers the whole sequence's K and V once, torchtitan's
# default) or "alltoall" (a ring of cp - 1 exchanges); the memory plan and the traffic count the all-gather
ROTATE = "allgather"
NO_CPU = ("PyTorch's context parallelism (ring attention over SDPA) runs only on CUDA: CPU attention "
          "(aten._scaled_dot_product_flash_attention_for_cpu) has no sharding rule in torch")


@contextlib.contextmanager
def sequence_shard(cp_mesh, x: torch.Tensor, y: torch.Tensor):
    """Inside: this rank's shard of token ids ``x``, targets ``y`` ([b, s]) and their positions ([1, s / cp]);
    SDPA is the ring over ``cp_mesh``.  Forward and backward both run inside."""
    import torch
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(ROTATE)
    x, y = x.contiguous().clone(), y.contiguous().clone()  # sharded in place (resized): not the stream's views
    pos = torch.arange(x.shape[1], device=x.device)[None]
    with context_parallel(cp_mesh, buffers=[x, y, pos], buffer_seq_dims=[1, 1, 1], no_restore_buffers={x, y, pos}):
        yield x, y, pos


def describe(cp: int) -> dict:
    return {"context_parallel": f"cp={cp}: torch context_parallel (ring attention over SDPA, K/V by {ROTATE}), "
                                "sequences sharded head-tail (load-balanced causal work), FSDP2 over dp x cp"}

"""Helpers of the tests that check bench's megatron-core model against bench's own on CPU (gloo, 2 ranks)."""
from __future__ import annotations

import copy

import torch


def grads_as_model(model):
    """A copy of ``model`` whose parameters are its gradients (to map them like weights)."""
    g = copy.deepcopy(model)
    for q, p in zip(g.parameters(), model.parameters()):
        q.data = p.grad.clone()
    return g


def run_virtual_pipeline_by_hand(chunks, x, pos, y, d_model: int, rank: int) -> float | None:
    """Four one-stage chunks over two ranks (PP = 2 x 2 virtual stages: rank r holds stages r and r + 2) run in
    pipeline order by hand, the activations sent between the ranks; the last stage's mean loss (on rank 1)."""
    import torch.distributed as dist

    h = torch.empty(x.shape[1], x.shape[0], d_model)  # megatron's [s, b, h]
    loss = None
    with torch.no_grad():
        for stage in range(4):
            owner, c = stage % 2, chunks[stage // 2]
            if owner != rank:
                continue
            if stage > 0:
                dist.recv(h, src=1 - rank)
                c.set_input_tensor(h)
            if stage < 3:
                dist.send(c(x, pos, None).contiguous(), dst=1 - rank)
            else:
                loss = c(x, pos, None, labels=y).mean().item()
    return loss

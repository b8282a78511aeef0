"""PyTorch context parallelism (ring attention over SDPA) on bench's model, against the same model on the
whole sequence: loss and gradients, per variant.  torchrun --nproc_per_node N benchmarks/cp_check.py VARIANT

VARIANT: comma-separated words: fp32 | bf16, compile, fsdp (FSDP2 over the flattened dp x cp mesh), cp=K."""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import set_rotate_method

from bench.models.model import GPT, lm_loss

CFG = dict(d_model=256, n_heads=8, n_kv_heads=2, n_layers=2, d_ff=512, vocab_size=1000, seq_len=256, arch="llama")


def main(variant: str) -> None:
    words = dict(w.split("=") if "=" in w else (w, "1") for w in variant.split(","))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    cp = int(words.get("cp", world))
    dp = world // cp
    mesh = init_device_mesh("cuda", (dp, cp), mesh_dim_names=("dp", "cp"))
    dtype = torch.bfloat16 if "bf16" in words else torch.float32
    torch.manual_seed(0)
    model = GPT(**CFG).cuda()
    ref = GPT(**CFG).cuda()
    ref.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(1)
    x_all = torch.randint(0, CFG["vocab_size"], (2 * dp, CFG["seq_len"] + 1), generator=g).cuda()
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        ref_loss = lm_loss(ref(x_all[:, :-1]), x_all[:, 1:])
    ref_loss.backward()
    if "compile" in words:
        for name, block in list(model.blocks.items()):
            model.blocks[name] = torch.compile(block)
    if "fsdp" in words:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        flat = mesh["dp", "cp"]._flatten("dp_cp")
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for block in model.blocks.values():
            fully_shard(block, mesh=flat, mp_policy=mp)
        fully_shard(model, mesh=flat, mp_policy=mp)
    c = mesh.get_coordinate()
    x = x_all[2 * c[0]:2 * c[0] + 2].clone()
    inp, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    pos = torch.arange(CFG["seq_len"], device="cuda")[None].contiguous()
    set_rotate_method(words.get("rotate", "allgather"))
    with context_parallel(mesh["cp"], buffers=[inp, tgt, pos], buffer_seq_dims=[1, 1, 1],
                          no_restore_buffers={inp, tgt, pos}):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32 and "fsdp" not in words):
            loss = lm_loss(model(inp, positions=pos), tgt)
        loss.backward()
    out = {"variant": variant, "rank": rank, "local_seq": inp.shape[1], "ref_loss": ref_loss.item()}
    lsum = loss.detach().clone()
    dist.all_reduce(lsum)
    out["cp_loss"] = lsum.item() / world
    diffs = []
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        gr = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        if "fsdp" not in words:
            gr = gr.clone()
            dist.all_reduce(gr)
            gr /= world
        diffs.append(((gr - q.grad).norm() / q.grad.norm().clamp_min(1e-12)).item())
    out["grad_rel_max"] = max(diffs)
    if rank == 0:
        print("CPCHECK " + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

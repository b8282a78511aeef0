"""Host cost of torch-native TP's pieces, without communication: bench's GPT on a 1-rank mesh.
Compares plain and DTensor (TP-planned) blocks, eager and compiled per block, for forward+backward,
AdamW (foreach, and fused as on GPUs) over the DTensor parameters vs over their local shards, and
gradient clipping.
  python benchmarks/tp_host_cost.py            CPU, gloo, micro dimensions (d_model 32, 24 blocks, 8 x 16
                                               tokens): almost no compute, so every ms is framework time
  python benchmarks/tp_host_cost.py --cuda     one GPU, NCCL, the 300m model at batch 8 (wall time per
                                               piece, synchronized: host time where it exceeds the GPU's)
About a minute; prints one line per case.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29556")
    cuda = "--cuda" in sys.argv[1:]
    dev = "cuda" if cuda else "cpu"
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1,
                            **({"device_id": torch.device("cuda", 0)} if cuda else {}))
    from torch.distributed.device_mesh import init_device_mesh

    from bench.model import GPT, lm_loss
    from bench.strategies.torch_tp import local_tensor, parallelize_blocks

    torch.manual_seed(0)
    mesh = init_device_mesh(dev, (1,), mesh_dim_names=("tp",))
    # (d_model, n_heads, n_layers, d_ff, vocab, seq_len), batch: micro on CPU, conf/model/300m.yaml on a GPU
    dims, batch = ((1024, 16, 24, 4096, 8000, 1024), 8) if cuda else ((32, 2, 24, 128, 256, 16), 8)
    x, y = (torch.randint(0, dims[4], (batch, dims[5]), device=dev) for _ in range(2))
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def ms(f, n=10) -> float:
        for _ in range(3):
            f()
        sync()
        t = time.perf_counter()
        for _ in range(n):
            f()
        sync()
        return (time.perf_counter() - t) / n * 1e3

    for tp in (False, True):
        for compiled in (False, True):
            m = GPT(*dims).to(dev)
            if tp:
                parallelize_blocks(m, mesh["tp"])
            if compiled:
                for b in m.blocks.values():
                    b.compile()
            params = list(m.parameters())
            from torch.distributed.tensor import DTensor
            # DTensor and plain parameters in separate groups: the foreach / fused kernels refuse mixed lists
            groups = [[q for q in params if isinstance(q, DTensor)], [q for q in params if not isinstance(q, DTensor)]]
            local = [local_tensor(q.detach()) for q in params]
            assert all(lp.data_ptr() == local_tensor(q).data_ptr() for lp, q in zip(local, params))

            def on_params(fused: bool):  # foreach is the CPU default; fused is what bench runs on GPUs
                return torch.optim.AdamW([{"params": g} for g in groups if g], lr=1e-3, fused=fused).step

            def on_local_shards(fused: bool):  # what bench's torch TP / PP do (torch_pp.py)
                opt = torch.optim.AdamW(local, lr=1e-3, fused=fused)

                def step():
                    for lp, q in zip(local, params):
                        lp.grad = local_tensor(q.grad)
                    opt.step()
                return step

            def fwd_bwd():
                for q in params:
                    q.grad = None
                with torch.autocast(dev, dtype=torch.bfloat16):
                    loss = lm_loss(m(x), y)
                loss.backward()

            fwd_bwd()
            t_fb = ms(fwd_bwd)
            t_opt, t_fused = (ms(on_params(fused)) for fused in (False, True))
            t_local, t_local_fused = (ms(on_local_shards(fused)) for fused in (False, True))
            grads = [q.grad for q in params]

            def clip_loop():  # bench's _clip_grads: a norm and a scale per gradient
                total = torch.zeros((), device=dev)
                for g in grads:
                    total += local_tensor(g).float().pow(2).sum()
                coef = (1.0 / (total.sqrt() + 1e-6)).clamp(max=1.0)
                for g in grads:
                    local_tensor(g).mul_(coef)

            print(f"tp={tp!s:5} compiled={compiled!s:5}  forward+backward {t_fb:6.1f} ms   "
                  f"AdamW (foreach / fused) over the parameters {t_opt:5.1f} / {t_fused:5.1f} ms, "
                  f"over local shards {t_local:5.1f} / {t_local_fused:5.1f} ms   clip {ms(clip_loop):4.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

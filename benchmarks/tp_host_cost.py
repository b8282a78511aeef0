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


TORCH_ADAMW = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "weight_decay": 1e-2}  # torch.optim.AdamW's defaults


class OneRank:
    """A 1-rank process group and mesh, bench's GPT dimensions and a batch, and a synchronized timer:
    CPU (gloo, micro dimensions) by default, one GPU (NCCL, the 300m model) with --cuda."""

    def __init__(self, dim_name: str, port: str):
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", port)
        self.cuda = "--cuda" in sys.argv[1:]
        self.dev = "cuda" if self.cuda else "cpu"
        dist.init_process_group("nccl" if self.cuda else "gloo", rank=0, world_size=1,
                                **({"device_id": torch.device("cuda", 0)} if self.cuda else {}))
        from torch.distributed.device_mesh import init_device_mesh

        torch.manual_seed(0)
        self.mesh = init_device_mesh(self.dev, (1,), mesh_dim_names=(dim_name,))
        # (d_model, n_heads, n_layers, d_ff, vocab, seq_len), batch: micro on CPU, conf/model/300m.yaml on a GPU
        self.dims, batch = ((1024, 16, 24, 4096, 8000, 1024), 8) if self.cuda else ((32, 2, 24, 128, 256, 16), 8)
        self.x, self.y = (torch.randint(0, self.dims[4], (batch, self.dims[5]), device=self.dev) for _ in range(2))

    def ms(self, f, n: int = 10) -> float:
        """Mean wall ms of f over n calls after 3, synchronized around the window."""
        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        for _ in range(3):
            f()
        sync()
        t = time.perf_counter()
        for _ in range(n):
            f()
        sync()
        return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    r = OneRank("tp", "29556")
    from bench.models.model import GPT, lm_loss
    from bench.parallel.optim import LocalShardAdamW, clip_grads_
    from bench.parallel.tp import apply_tp

    mesh, dims, dev, x, y, ms = r.mesh, r.dims, r.dev, r.x, r.y, r.ms
    for tp in (False, True):
        for compiled in (False, True):
            m = GPT(*dims).to(dev)
            if tp:
                apply_tp(m, mesh["tp"])
            if compiled:
                for b in m.blocks.values():
                    b.compile()
            params = list(m.parameters())
            from torch.distributed.tensor import DTensor
            # DTensor and plain parameters in separate groups: the foreach / fused kernels refuse mixed lists
            groups = [[q for q in params if isinstance(q, DTensor)], [q for q in params if not isinstance(q, DTensor)]]

            def on_params(fused: bool):  # foreach is the CPU default; fused is what bench runs on GPUs
                return torch.optim.AdamW([{"params": g} for g in groups if g], lr=1e-3, fused=fused).step

            def on_local_shards(fused: bool):  # what bench's torch TP / PP and FSDP2 do
                return LocalShardAdamW(params, TORCH_ADAMW, fused=fused).step

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

            def clip():  # bench's torch TP / PP clipping on one rank
                clip_grads_(grads, 1.0, dev)

            print(f"tp={tp!s:5} compiled={compiled!s:5}  forward+backward {t_fb:6.1f} ms   "
                  f"AdamW (foreach / fused) over the parameters {t_opt:5.1f} / {t_fused:5.1f} ms, "
                  f"over local shards {t_local:5.1f} / {t_local_fused:5.1f} ms   clip {ms(clip):4.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Where FSDP2's time per step goes, without the profiler (which doubles a 300m step's time):
bench's GPT with FSDP2 as bench wraps it (blocks compiled, then units of k blocks, then the root)
on a 1-rank mesh, forward+backward timed with FSDP2's work switched off piece by piece:
  full         what bench runs: all-gather per unit, reduce-scatter and sharded gradients after backward
  no-reduce    set_requires_gradient_sync(False): no reduce-scatter, no sharded gradients
  no-comm      also no resharding after forward or backward: parameters stay gathered, no all-gather
against the same compiled blocks without FSDP (autocast bf16, as `single`), and FSDP2's AdamW step
(fused over local shards, bench's LocalShardAdamW).
  python benchmarks/fsdp_host_cost.py          CPU, gloo, micro dimensions
  python benchmarks/fsdp_host_cost.py --cuda   one GPU, NCCL, the 300m model at batch 8
Every FSDP2 configuration is a new model whose compiled blocks add Dynamo cache entries, so the
recompile limit is raised (at its default of 8, later blocks would silently run eagerly), and the
whole sequence runs twice, to show the spread.
"""
import gc

import torch
import torch.distributed as dist
from tp_host_cost import TORCH_ADAMW, OneRank


def main() -> None:
    r = OneRank("dp", "29557")
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    from bench.models.model import GPT, lm_loss
    from bench.parallel.dp import apply_fsdp
    from bench.parallel.optim import LocalShardAdamW

    def build(k: int | None, reshard: bool = False):
        m = GPT(*r.dims).to(r.dev)
        for b in m.blocks.values():
            b.compile()
        if k is not None:  # bench's FSDP2 wrapping: units of k blocks, bf16 parameters, fp32 reduce-scatter
            apply_fsdp(m, r.mesh, "bf16", {"reduce_dtype": "fp32", "blocks_per_unit": k,
                                           "reshard_after_forward": reshard, "prefetch": 0}, False, r.dev)
        return m

    def fwd_bwd(m, autocast: bool):
        def f():
            m.zero_grad(set_to_none=True)
            with torch.autocast(r.dev, dtype=torch.bfloat16, enabled=autocast):
                loss = lm_loss(m(r.x), r.y)
            loss.backward()
        return f

    def ms(f) -> float:
        return r.ms(f, n=20)

    for rep in (1, 2):
        plain = build(None)
        print(f"[pass {rep}] plain compiled blocks (autocast): forward+backward {ms(fwd_bwd(plain, True)):6.1f} ms",
              flush=True)
        del plain
        for k, reshard in ((1, False), (4, False), (24, False), (1, True), (4, True)):
            times = {}
            for mode in ("full", "no-reduce", "no-comm"):
                gc.collect()
                if r.cuda:
                    torch.cuda.empty_cache()
                m = build(k, reshard)
                if mode != "full":
                    m.set_requires_gradient_sync(False)
                if mode == "no-comm":
                    m.set_reshard_after_forward(False)
                    m.set_reshard_after_backward(False)
                times[mode] = ms(fwd_bwd(m, False))
                if mode == "full":
                    opt = LocalShardAdamW(m.parameters(), TORCH_ADAMW, fused=r.cuda)
                    times["AdamW"] = ms(opt.step)
                    del opt
                del m
            print(f"[pass {rep}] FSDP2 units of {k:2d} reshard={reshard!s:5}: forward+backward " +
                  "  ".join(f"{mode} {times[mode]:6.1f}" for mode in ("full", "no-reduce", "no-comm")) +
                  f" ms   AdamW {times['AdamW']:5.1f} ms", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

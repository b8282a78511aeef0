"""What a strategy holds between training steps, one rank: the device memory allocated at each step's start and
end, its peak, whether a micro-batch's logits outlive their step (a weak reference to each, with what refers to
it), and what a full garbage collection frees after step 3.  Why: DeepSpeed ZeRO with torch.compile started its
steps 2,004 MiB above DDP on one H100, one micro-batch's bf16 logits (results/2026-12-06-h100x1-zero-memory).

    python benchmarks/zero_memory.py OUT.json [override ...]      # 5 steps (2 warm-up) of bench's strategy

On CPU it runs too (a smoke test): the allocator figures read 0."""
import gc, json, os, sys, weakref
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
import torch, torch.distributed as dist
import bench.models.model as mm
CUDA = torch.cuda.is_available()


def alloc():
    return torch.cuda.memory_allocated() if CUDA else 0


def peak():
    return torch.cuda.max_memory_allocated() if CUDA else 0


def sync():
    if CUDA:
        torch.cuda.synchronize()

refs = []
orig = mm.lm_loss
def lm_loss(logits, targets):
    refs.append(weakref.ref(logits))
    return orig(logits, targets)
mm.lm_loss = lm_loss


def build(overrides):
    from hydra import compose, initialize_config_dir
    from bench.run.config import register_configs, validate
    from bench.strategies.registry import get_spec
    from bench.strategies.base import DistContext
    register_configs()
    with initialize_config_dir(config_dir=f"{os.getcwd()}/conf", version_base="1.3"):
        plan = validate(compose("config", overrides=list(overrides)), gpus=1 if CUDA else 0)
    ctx = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cuda", 0) if CUDA else torch.device("cpu"), backend="nccl" if CUDA else "gloo")
    st = get_spec(plan.strategy.name).implementation(plan)(plan, ctx)
    st.setup()
    return plan, st


def main(out, overrides):
    if CUDA:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if CUDA else "gloo", rank=0, world_size=1)
    plan, st = build(overrides + ["world_size=1", f"device={'cuda' if CUDA else 'cpu'}", "steps=6", "warmup_steps=2"])
    from bench.plan.memory_model import memory_plan
    rows = []
    MB = 2**20
    for n in range(5):
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        a0 = alloc()
        st.step(n)
        sync()
        a1 = alloc()
        alive = [r() for r in refs]
        alive_n = sum(t is not None for t in alive)
        who = []
        for t in alive:
            if t is not None:
                who.append([type(x).__name__ for x in gc.get_referrers(t)][:6] + [str(tuple(t.shape)), str(t.dtype), str(sys.getrefcount(t))])
        del alive
        rec = {"step": n, "start_mb": a0 / MB, "end_mb": a1 / MB, "peak_mb": peak() / MB,
               "logits_alive_after_step": alive_n, "referrers": who}
        if n == 3:
            gc.collect()
            sync()
            rec["after_gc_mb"] = alloc() / MB
            rec["logits_alive_after_gc"] = sum(r() is not None for r in refs)
        refs.clear()
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    mem = memory_plan(plan)
    res = {"overrides": overrides, "rows": rows, "plan_peak_mb": mem["predicted_peak_allocated_mb"],
           "describe": {k: v for k, v in st.describe().items() if k in ("optimizer", "compiled", "precision", "grad_accum")}}
    json.dump(res, open(out, "w"), indent=1, default=str)
    print("plan", mem["predicted_peak_allocated_mb"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

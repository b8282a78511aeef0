"""Bytes of memory-bound tensor work per training step of bench's strategies on CPU, op by op and by who issued it:
to count what DeepSpeed ZeRO-0/1/2 adds over DDP (copies, casts, divides between its flat buffers).

    python benchmarks/zero_copies.py [--ws 2] OUT.json [override ...]       # one step, one or two gloo ranks
    python benchmarks/zero_copies.py --table OUT.json [BASE.json]          # per-op table, in units of 4 B x params

One training step (after 2 warm-up steps) runs under a TorchDispatchMode that records every aten op: reads = its
tensor inputs' bytes (not the destination of copy_ / zero_ / fill_ / out=, only written), writes = its outputs'; a
copy_ of a tensor onto the same memory moves nothing (at::copy_ returns at once). Each op goes to the innermost
frame outside torch: the model (forward and the C++ autograd engine), the optimizer, DeepSpeed's file:line, or a
collective (left out of the totals). Why: on one H100, ZeRO-1 and ZeRO-2 added 24-77 ms of GPU time over DDP, all in
copy and elementwise kernels (results/2026-12-06-h100x1-zero-copies); this names each copy and its bytes.
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

REPO = str(Path(__file__).resolve().parents[1])

TORCH_DIR = os.path.dirname(torch.__file__)
WRITE_ONLY = {"copy_", "zero_", "fill_", "set_", "copy"}  # overloads whose mutated self is not read


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


PLUMBING = ("_dynamo/eval_frame.py", "_compile.py", "utils/_python_dispatch.py", "_ops.py", "overrides.py")
FACTORIES = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "resize_"}  # allocate only
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "_reduce_scatter", "_allgather", "barrier")


def _same_data(a, b) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride())


def classify(frame) -> str:
    f = frame
    first = True  # the first frame that is not dispatch plumbing
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith(TORCH_DIR):
            rel = fn[len(TORCH_DIR) + 1:]
            if rel.startswith(PLUMBING):
                f = f.f_back
                continue
            if first and rel.startswith("autograd/graph.py"):
                return "model"  # a kernel of the C++ autograd engine (no Python frame between)
            first = False
            if rel.startswith("optim/"):
                return "optimizer"
            if rel.startswith("nn/parallel/") or rel.startswith("distributed/"):
                return f"other:torch/{rel}:{f.f_lineno} {f.f_code.co_name}"
            if rel.startswith("nn/utils/clip_grad"):
                return "clip"
            f = f.f_back
            continue
        first = False
        if "/bench/models/" in fn:
            return "model"
        if "/site-packages/deepspeed/" in fn:
            rel = fn.split("/site-packages/deepspeed/")[1]
            return f"ds:{rel}:{f.f_lineno} {f.f_code.co_name}"
        if fn == __file__:
            return "script"
        if "/bench/" in fn:
            return f"other:{fn.split(REPO + '/')[-1]}:{f.f_lineno} {f.f_code.co_name}"
        if "/site-packages/" in fn:
            f = f.f_back
            continue
        return f"other:{fn}:{f.f_lineno} {f.f_code.co_name}"
    return "no-python-frame"


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.rows = defaultdict(lambda: [0, 0, 0])  # (where, op, dtypes) -> [calls, read bytes, write bytes]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or func._schema.name in ("aten::detach", "aten::alias", "aten::lift_fresh",
                                                 "aten::_has_compatible_shallow_copy_type", "aten::set_"):
            return out
        name = func._schema.name.split("::")[1]
        base = func.overloadpacket.__name__
        if base in FACTORIES:
            return out
        # which inputs are only written (copy_ dst, zero_, fill_, out= args)
        read = 0
        for i, a in enumerate(func._schema.arguments):
            v = args[i] if i < len(args) else kwargs.get(a.name, None)
            written_only = a.alias_info is not None and a.alias_info.is_write and (
                base in WRITE_ONLY or a.is_out or a.kwarg_only and a.name.startswith("out"))
            if written_only:
                continue
            flat, _ = tree_flatten(v)
            read += sum(_nbytes(t) for t in flat)
        flat_out, _ = tree_flatten(out)
        write = sum(_nbytes(t) for t in flat_out)
        if base == "copy_" and _same_data(args[0], args[1]):
            # at::copy_ returns at once when dst and src are views of the same data (Copy.cpp is_same_data)
            name, read, write = "copy_[same-data no-op]", 0, 0
        dtypes = ",".join(sorted({str(t.dtype).replace("torch.", "") for t in tree_flatten((args, kwargs))[0]
                                  if isinstance(t, torch.Tensor)} | {"->" + str(t.dtype).replace("torch.", "")
                                                                     for t in flat_out if isinstance(t, torch.Tensor)}))
        where = classify(sys._getframe(1))
        r = self.rows[(where, name, dtypes)]
        r[0] += 1
        r[1] += read
        r[2] += write
        return out


def build(overrides: list[str], rank: int, world: int, device: torch.device = torch.device("cpu"),
          gpus: int | None = None):
    """(plan, set-up strategy, parameters) of bench's run for these overrides, on this rank of an initialized group
    (also benchmarks/zero_memory.py's, on one GPU; benchmarks/fake_ranks.py's, ``gpus`` the layout's, on one)."""
    from hydra import compose, initialize_config_dir
    from bench.run.config import register_configs, validate
    from bench.strategies.registry import get_spec
    from bench.strategies.base import DistContext
    from bench.metrics.flops import total_params

    register_configs()
    with initialize_config_dir(config_dir=f"{REPO}/conf", version_base="1.3"):
        plan = validate(compose("config", overrides=list(overrides)),
                        gpus=int(device.type == "cuda") if gpus is None else gpus)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    ctx = DistContext(rank=rank, local_rank=rank, world_size=world, device=device, backend=plan.backend)
    strat = get_spec(plan.strategy.name).implementation(plan)(plan, ctx)
    strat.setup()
    return plan, strat, total_params(plan.model)


def main_rank(rank: int, world: int, out_path: str, overrides: list[str], port: int, warm: int = 2):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    overrides = list(overrides) + [f"world_size={world}", f"steps={warm + 1}", f"warmup_steps={warm}"]
    plan, strat, nparams = build(overrides, rank, world)
    for n in range(warm):
        strat.step(n)
    rec = Recorder()
    with rec:
        res = strat.step(warm)
    loss = float(res.loss) if res.loss is not None else None
    if rank == 0:
        rows = [{"where": k[0], "op": k[1], "dtypes": k[2], "calls": v[0], "read": v[1], "write": v[2]}
                for k, v in sorted(rec.rows.items())]
        try:
            desc = strat.describe()
            desc = {k: desc.get(k) for k in ("optimizer", "optimizer_wrapper", "precision", "grad_accum",
                                             "micro_batch_size", "ds_config", "dp_reduction",
                                             "gradient_as_bucket_view")}
        except Exception as e:  # noqa: BLE001
            desc = {"error": repr(e)}
        json.dump({"overrides": overrides, "world_size": world, "params": nparams, "loss": loss,
                   "grad_accum": plan.grad_accum, "describe": desc, "rows": rows}, open(out_path, "w"), indent=1,
                  default=str)
        print(f"wrote {out_path}: params={nparams} grad_accum={plan.grad_accum} loss={loss}")
    dist.barrier()
    if hasattr(strat, "close"):
        strat.close()
    dist.destroy_process_group()


def table(path: str, base: str = None) -> str:
    """Per-op rows of DeepSpeed's and other non-model work (units of 4 B x parameters), then totals by who issued the
    work, and the total over BASE's (e.g. DDP's run of the same settings) where given."""
    def load(p):
        return json.load(open(p))

    def who(r):
        if any(c in r["op"] for c in COLLECTIVES):
            return "collective"
        return r["where"] if r["where"] in ("model", "optimizer") else r["where"].split(":")[0]

    def totals(d):
        out = defaultdict(float)
        for r in d["rows"]:
            out[who(r)] += (r["read"] + r["write"]) / (4 * d["params"])
        return out

    d = load(path)
    u = 4 * d["params"]
    rows = sorted((r for r in d["rows"] if who(r) not in ("model", "optimizer") and r["read"] + r["write"] > 1e-3 * u),
                  key=lambda r: -(r["read"] + r["write"]))
    lines = [f"{(r['read'] + r['write']) / u:7.3f}  calls={r['calls']:4d} {r['op']:<22} {r['dtypes']:<28} {r['where']}"
             for r in rows]
    t = totals(d)
    lines.append("totals: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(t.items())))
    if base:
        def work(x):  # what the step moves, the collectives left out
            return sum(v for k, v in x.items() if k != "collective")
        lines.append(f"over {base}, collectives left out: {work(t) - work(totals(load(base))):+.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv and argv[0] == "--table":
        print(table(*argv[1:3]))
        sys.exit(0)
    world = 1
    if argv and argv[0] == "--ws":
        world = int(argv[1])
        argv = argv[2:]
    out_path, overrides = argv[0], argv[1:]
    port = 20000 + os.getpid() % 20000
    if world == 1:
        main_rank(0, 1, out_path, overrides, port)
    else:
        import torch.multiprocessing as mp
        mp.start_processes(main_rank, args=(world, out_path, overrides, port), nprocs=world, start_method="spawn")

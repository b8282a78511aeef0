"""torch-native TP under FSDP2: the collectives one training step issues, counted on a real 4-rank gloo run by torch's
own CommDebugMode (torch.distributed.tensor.debug), against what bench's traffic model counts for the same layout
(bench/costs/traffic.py ``torch_tp``, bench/strategies/fsdp.py ``_gathered``): the bytes each rank sends per kind
(TP activation all-reduces, FSDP2's parameter all-gathers and gradient reduce-scatters, ring bytes) and the TP
all-reduce calls (float8's amax all-reduces among them).  bench's model and steps run as a run builds them
(bench/strategies/torch_native.py), eager on CPU; precision=fp8 is planned for an H100 and built on CPU.  The same count
from one process in torch's fake process group checks benchmarks/fake_ranks.py's premise: its rank 0 calls as the
real layout's rank 0 does."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.conftest import spawn_ranks, start_ranks
from tests.test_hsdp import plan_of

# llama_tiny with an MLP width whose tp=2 shards stay multiples of 16, so precision=fp8 converts every projection
TINY = ("model=llama_tiny", "model.d_ff=768", "world_size=4", "strategy=fsdp", "strategy.tp=2")
KIND = {"all_reduce": "activation", "_allgather_base_": "param_gather", "_reduce_scatter_base_": "grad_reduce"}


def _sent(op: str, n: int, nbytes: list[int]) -> float:
    """Ring bytes one rank sends (bench/costs/traffic.py's convention): all-reduce 2 B (n-1)/n of its tensor, an
    all-gather / reduce-scatter B (n-1)/n of the whole (the larger of its two buffers)."""
    if op == "all_reduce":
        return 2 * nbytes[0] * (n - 1) / n
    return max(nbytes) * (n - 1) / n


class _NoModules:
    name, is_bw, activation_checkpointing = "Global", False, False
    module_parents_dict = {"Global": set()}

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return None


def _counting_mode():
    import torch
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops

    class Recorded(CommDebugMode):
        """CommDebugMode (which counts calls) with each collective's tensors and group size kept."""

        def __init__(self):
            super().__init__()
            self.calls: list[tuple[str, int, list[int]]] = []
            # its per-module tracker loses its place over several micro-batches' forwards (IndexError in
            # _fw_set_module_hook); the counts here need no module names
            self.advanced_module_tracker = _NoModules()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if out is NotImplemented or isinstance(func, torch._ops.HigherOrderOperator):
                return out
            packet = func._overloadpacket
            if packet in self.comm_registry or packet in c10d_collective_ops:
                flat = [a for a in args if isinstance(a, torch.Tensor)] + [
                    t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
                names = [a for a in args if isinstance(a, str)]  # functional: (..., reduce op, group name)
                sizes = sorted(t.numel() for t in flat)
                n = (c10d._resolve_process_group(names[-1]).size() if names
                     else sizes[-1] // sizes[0])  # c10d's gather / scatter: whole / shard
                self.calls.append((str(packet).split(".")[-1], n, [t.numel() * t.element_size() for t in flat]))
            return out

    return Recorded()


def _count_step(rank: int, world: int, plan_dict: dict, out: str) -> None:
    import torch

    from bench.parallel.dp import FSDP2
    from bench.run.config import plan_from_dict
    from bench.strategies.base import DistContext
    from bench.strategies.torch_native import TorchParallel

    torch.manual_seed(0)
    s = TorchParallel(plan_from_dict(plan_dict), DistContext(rank, rank, world, torch.device("cpu"), "gloo"), FSDP2())
    s.setup()
    s.step(0)  # FSDP2's lazy init, the optimizer
    s.after_step = None  # float8's scales for the next step's gathers: one all-reduce after the step, not counted
    mode = _counting_mode()
    with mode:
        s.step(1)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(mode.calls, f)
    del s, mode


# the layouts counted: float8 styles (the MLP's input cast once), float8 all-gather, resharding, 2 micro-batches; 2 blocks
# of 32 tokens (on the CPU float8's matmuls run as torchao's emulation: bench/parallel/float8.py); bf16: llama's gate and
# up each all-reduce their input gradient; no resharding, units of 2 blocks; 32 tokens (bf16 is slow on a CPU without
# bf16 instructions: docs/development.md)
LAYOUTS = {
    "fp8-reshard-accum": ("precision=fp8", "compile=true", "strategy.micro_batch_size=2", "model.n_layers=2",
                          "model.seq_len=32"),
    "bf16-units": ("precision=bf16", "strategy.reshard_after_forward=false", "strategy.blocks_per_unit=2",
                   "model.seq_len=32"),
}


def _layout(name: str):
    """(the layout's plan, planned for an H100; the plan dict its CPU ranks run: gloo, eager)."""
    plan = plan_of("dry_run=true", "hardware=h100_sxm_80gb", *TINY, *LAYOUTS[name])
    d = plan.to_dict()
    d.update(device="cpu", backend="gloo", run={**d["run"], "device": "cpu", "compile": False})
    return plan, d


def _real_calls(name: str, folder) -> list:
    """The collectives of one step of rank 0 of the layout's real 4-rank gloo run."""
    plan, d = _layout(name)
    out = str(folder / "calls.json")
    spawn_ranks(_count_step, plan.world_size, d, out)
    with open(out) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def fp8_real_calls(tmp_path_factory):
    """The fp8 layout's real run, counted once for the two tests that read it."""
    return _real_calls("fp8-reshard-accum", tmp_path_factory.mktemp("fp8"))


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_traffic_model_counts_what_commdebugmode_counts(tmp_path, name, request):
    from bench.plan.memory_model import memory_plan
    from bench.costs.traffic import torch_tp
    from bench.strategies.registry import get_spec

    plan, _ = _layout(name)
    want = get_spec("fsdp").traffic(plan, float(memory_plan(plan)["parameters_on_rank"]))
    calls = request.getfixturevalue("fp8_real_calls") if name == "fp8-reshard-accum" else _real_calls(name, tmp_path)
    sent, count = Counter(), Counter()
    for op, n, nbytes in calls:
        scalar = op == "all_reduce" and nbytes[0] <= 8  # float8's amax all-reduces: latency, no bytes to speak of
        sent["amax" if scalar else KIND[op]] += _sent(op, n, nbytes)
        count["amax" if scalar else op] += 1
    for kind in KIND.values():
        assert sent[kind] == pytest.approx(want[kind], rel=1e-6), (kind, dict(sent), want)
    tp = torch_tp(plan)  # every all-reduce here is over the tp group
    assert count["all_reduce"] == tp["collectives"] and count["amax"] == tp.get("scalar_collectives", 0), (count, tp)


def _count_fake_rank(_: int, world: int, plan_dict: dict, out: str) -> None:
    """Rank 0 of the layout alone, its collectives faked (benchmarks/fake_ranks.py's process group)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        _count_step(0, world, plan_dict, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_fake_rank_issues_the_collectives_of_the_real_layouts_rank_0(tmp_path, fp8_real_calls):
    """benchmarks/fake_ranks.py times rank 0 of a layout on one device with torch's fake process group: it runs the
    rank's own work as the real layout does only if it makes the same calls.  The collectives of one fp8 FSDP2 TP=2
    step (op, group size, bytes, in order) from a fake rank equal rank 0's in the real 4-rank gloo run."""
    plan, d = _layout("fp8-reshard-accum")
    fake = str(tmp_path / "fake.json")
    start_ranks(_count_fake_rank, (plan.world_size, d, fake))
    with open(fake) as g:
        real_calls, fake_calls = fp8_real_calls, json.load(g)
    assert len(real_calls) > 20 and {op for op, _, _ in real_calls} == {"all_reduce", "_allgather_base_",
                                                                        "_reduce_scatter_base_"}
    assert fake_calls == real_calls

"""The memory plan (bench/plan/memory_model.py) against PyTorch's own memory tracker (torch.distributed._tools:
MemTracker, FSDPMemTracker; what torchtitan's memory estimation uses) on bench's own model, wrapping and
gradient accumulation (bench/strategies/torch_native.py), one rank of a fake process group on the CPU.

Where the tracker does not cover the case: DDP's reducer buckets are allocated in C++ when DDP wraps (before the
tracked step) and are not seen, so DDP is compared with accumulation, where the kept gradients dominate; the fake
group's all-reduce returns no tensor, so DDP reduces through a no-op comm hook (the buckets stay as they are)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir

from bench.run.config import register_configs, validate
from bench.plan.memory_model import memory_plan
from bench.strategies.base import DistContext
from bench.strategies.registry import get_spec
from tests.conftest import REPO

register_configs()
BASE = ("device=cpu", "model=llama_tiny", "model.n_layers=2", "precision=bf16", "steps=3", "warmup_steps=1")


def _tracked_peak(plan) -> float:
    """The tracker's peak over one training step (after a first one built the optimizer and buckets)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.world_size)
    try:
        st = get_spec(plan.strategy["name"]).implementation(plan)(
            plan, DistContext(0, 0, plan.world_size, torch.device("cpu"), "gloo"))
        st.setup()
        if isinstance(st.model, torch.nn.parallel.DistributedDataParallel):
            from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

            st.model.register_comm_hook(None, noop_hook)
        st.step(0)
        opt = getattr(st.optimizer, "optimizer", st.optimizer)  # LocalShardAdamW wraps torch's
        fsdp = plan.strategy["name"] == "fsdp"
        tracker = FSDPMemTracker(st.model, opt) if fsdp else MemTracker()
        if not fsdp:
            tracker.track_external(st.model, opt)
        no_sync = st.policy.no_sync

        def each_micro_batch(model, last):  # the tracker refuses a module called twice without a reset
            tracker.reset_mod_stats()
            return no_sync(model, last)

        st.policy.no_sync = each_micro_batch
        with tracker:
            st.step(1)
        return sum(d["Total"] for d in tracker.get_tracker_snapshot("peak").values())
    finally:
        dist.destroy_process_group()


# accumulation on / off and reshard on / off over the four FSDP2 cases; before the plan counted FSDP2's kept
# unsharded gradients (ModelStates.accum_grad_bytes) "fsdp accumulating" was planned at 0.65 of the tracker's peak
CASES = {
    "single accumulating": ["strategy=single", "strategy.micro_batch_size=2"],
    "ddp accumulating": ["strategy=ddp", "world_size=2", "strategy.micro_batch_size=1"],
    "fsdp accumulating": ["strategy=fsdp", "world_size=4", "strategy.micro_batch_size=1"],
    "fsdp no reshard": ["strategy=fsdp", "world_size=4", "strategy.reshard_after_forward=false"],
    "fsdp accumulating, synced every micro-batch": ["strategy=fsdp", "world_size=4", "strategy.micro_batch_size=1",
                                                    "strategy.sync_every_microbatch=true"],
    "single, every second block checkpointed": ["strategy=single", "model.n_layers=4", "recompute=full",
                                                "recompute_every=2"],
    # a Qwen2.5-sized vocabulary (152k): the loss' logits buffers dominate (issue 48: the logits of a 152k vocab)
    "single, 152k vocabulary": ["strategy=single", "model.vocab_size=151936", "model.seq_len=128",
                                "model.global_batch=4", "strategy.micro_batch_size=2"],
    # (DDP is not compared here: its reducer buckets, a copy of every gradient, 300 MiB at this vocabulary, are
    # allocated before the tracked step and the tracker does not see them)
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_plan_is_within_10pct_of_torchs_memory_tracker(name):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        plan = validate(compose("config", overrides=[*BASE, *CASES[name]]), gpus=0)
    planned = memory_plan(plan)["predicted_peak_allocated_mb"] * 2**20
    tracked = _tracked_peak(plan)
    assert abs(planned / tracked - 1) <= 0.10, f"{name}: plan {planned / 2**20:.1f} MiB, tracker {tracked / 2**20:.1f}"


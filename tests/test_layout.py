"""bench.spec.layout: rank -> (dp, pp, tp) in Megatron's order, token accounting, micro-batches,
pipeline stages, and the whole layout a composed plan carries (plan.layout).  No processes."""
from __future__ import annotations

import dataclasses

import pytest

from bench.spec.layout import Coord, Layout, local_stages, resolve_microbatches, resolve_schedule, stage_layers
from bench.spec.schema import Plan


def groups(lay: Layout, kind: str) -> list[list[int]]:
    """All process groups of one kind ("tp", "dp" or "pp"): ranks equal in the other two coordinates."""
    out: dict[tuple, list[int]] = {}
    for r in range(lay.world_size):
        c = lay.coords(r)
        out.setdefault(tuple(getattr(c, k) for k in ("tp", "dp", "pp") if k != kind), []).append(r)
    return sorted(out.values())

# 8-rank 3D layouts, written tp x pp x dp
LAYOUTS_8 = [(2, 2, 2), (2, 4, 1), (4, 2, 1), (1, 2, 4)]


def test_2x2x2_coordinates_follow_megatron_order_tp_fastest_then_dp_then_pp():
    lay = Layout(tp=2, pp=2, dp=2)
    table = [(lay.coords(r).tp, lay.coords(r).dp, lay.coords(r).pp) for r in range(8)]
    assert table == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)]
    assert groups(lay, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(lay, "dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups(lay, "pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_specific_8_rank_layouts():
    assert groups(Layout(tp=2, pp=4, dp=1), "pp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert Layout(tp=2, pp=4, dp=1).coords(7) == Coord(dp=0, pp=3, tp=1)
    assert groups(Layout(tp=4, pp=2, dp=1), "tp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert Layout(tp=4, pp=2, dp=1).coords(6) == Coord(dp=0, pp=1, tp=2)
    assert groups(Layout(tp=1, pp=2, dp=4), "dp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert Layout(tp=1, pp=2, dp=4).coords(5) == Coord(dp=1, pp=1, tp=0)


@pytest.mark.parametrize("tp,pp,dp", LAYOUTS_8)
def test_rank_coordinates_round_trip_and_partition(tp, pp, dp):
    lay = Layout(tp=tp, pp=pp, dp=dp)
    assert lay.world_size == 8 and lay.mesh_shape == (pp, dp, 1, tp)
    coords = [lay.coords(r) for r in range(8)]
    assert len(set(coords)) == 8
    assert all(c.tp + tp * c.dp + tp * dp * c.pp == r for r, c in enumerate(coords))  # Megatron's order
    # row-major over the (pp, dp, tp) mesh = the rank order (what init_device_mesh uses)
    assert [(c.pp, c.dp, c.tp) for c in coords] == sorted((c.pp, c.dp, c.tp) for c in coords)
    for kind, size in (("tp", tp), ("pp", pp), ("dp", dp)):
        gs = groups(lay, kind)
        assert len(gs) == 8 // size and all(len(g) == size for g in gs)
        assert sorted(r for g in gs for r in g) == list(range(8))


@pytest.mark.parametrize("tp,pp,dp", LAYOUTS_8)
def test_groups_equal_megatron_rank_generator(tp, pp, dp):
    from megatron.core.parallel_state import RankGenerator

    gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    lay = Layout(tp=tp, pp=pp, dp=dp)
    for kind in ("tp", "dp", "pp"):
        assert sorted(gen.get_ranks(kind)) == groups(lay, kind), kind


@pytest.mark.parametrize("tp,pp,dp", LAYOUTS_8 + [(1, 1, 8), (8, 1, 1), (1, 8, 1)])
def test_token_accounting_counts_each_replica_once(tp, pp, dp):
    """TP counts one replica (tp_rank 0), PP the last stage, DP the sum: global batch once."""
    lay, gb, seq = Layout(tp=tp, pp=pp, dp=dp), 16, 128
    tokens = [lay.tokens_this_rank(r, gb, seq) for r in range(8)]
    assert sum(tokens) == gb * seq
    counting = [lay.coords(r) for r in range(8) if tokens[r]]
    assert len(counting) == dp
    assert all(c.tp == 0 and c.pp == pp - 1 for c in counting)
    assert sorted(c.dp for c in counting) == list(range(dp))
    assert set(t for t in tokens if t) == {gb // dp * seq}


def test_microbatches_string_or_int():
    assert resolve_microbatches("p", 4) == 4
    assert resolve_microbatches("4p", 2) == 8
    assert resolve_microbatches(" 2P ", 3) == 6
    assert resolve_microbatches(8, 2) == 8
    assert resolve_microbatches("8", 2) == 8
    for bad in ("0p", 0, -1, "x", "p4", 1.5, True, None):
        with pytest.raises(ValueError):
            resolve_microbatches(bad, 2)


def test_pipeline_stages_interleaved_placement():
    assert local_stages(0, 2) == [0] and local_stages(1, 4, 2) == [1, 5]
    assert [list(stage_layers(k, 8, 4)) for k in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError):
        stage_layers(0, 6, 4)
    assert resolve_schedule("auto", 1) == "1f1b" and resolve_schedule("auto", 2) == "interleaved_1f1b"
    assert resolve_schedule("gpipe", 1) == "gpipe"


# --------------------------------------------------------------------------- the plan's layout, from real compositions
def _plan(*overrides: str):
    from hydra import compose, initialize_config_dir

    from bench.run.config import register_configs, validate
    from tests.conftest import REPO

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return validate(compose("config", overrides=["model=tiny", *overrides]), gpus=0)


# model=tiny: global batch 8, 4 layers, 4 heads; expected fields written out by hand from the overrides
COMPOSED = [
    (["strategy=ddp", "world_size=2", "strategy.micro_batch_size=2", "recompute=selective"],
     dict(tp=1, pp=1, dp=2, dp_replicate=1, virtual_pipeline=1, schedule="1f1b", micro_batch_size=2, grad_accum=2,
          recompute="selective")),
    (["strategy=fsdp", "world_size=8", "strategy.tp=2", "strategy.dp_replicate=2"],
     dict(tp=2, pp=1, dp=4, dp_replicate=2, virtual_pipeline=1, schedule="1f1b", micro_batch_size=2, grad_accum=1,
          recompute="none")),
    (["strategy=pp", "strategy.impl=torch", "world_size=4", "strategy.virtual_pipeline=2", "microbatches=2p",
      "recompute=full"],
     dict(tp=1, pp=2, dp=2, dp_replicate=1, virtual_pipeline=2, schedule="interleaved_1f1b", micro_batch_size=1,
          grad_accum=4, recompute="full")),
    (["strategy=fsdp", "world_size=2", "strategy.pp=2", "strategy.schedule=gpipe", "microbatches=p"],
     dict(tp=1, pp=2, dp=1, dp_replicate=1, virtual_pipeline=1, schedule="gpipe", micro_batch_size=4, grad_accum=2,
          recompute="none")),
]


@pytest.mark.parametrize("overrides,expected", COMPOSED, ids=[" ".join(o) for o, _ in COMPOSED])
def test_a_composed_plan_carries_its_whole_layout(overrides, expected):
    from bench.run.config import plan_from_dict

    plan = _plan(*overrides)
    assert {k: getattr(plan.layout, k) for k in expected} == expected
    assert plan.layout.dp_shard == expected["dp"] // expected["dp_replicate"]
    assert (plan.tp, plan.pp, plan.dp_size, plan.micro_batch_size, plan.grad_accum) == \
        tuple(expected[k] for k in ("tp", "pp", "dp", "micro_batch_size", "grad_accum"))
    assert plan_from_dict(plan.to_dict()).layout == plan.layout  # as the ranks receive it


def test_micro_batch_auto_keeps_the_per_rank_batch():
    """micro_batch_size=auto changes the split of the per-rank batch (ddp, dp=2: 4 sequences), never its size."""
    plan = _plan("strategy=ddp", "world_size=2", "strategy.micro_batch_size=auto", "memory_gib=0.05")
    assert plan.layout.per_rank_batch == 4 and plan.micro_batch_auto["chosen"] == plan.layout.micro_batch_size
    assert plan.layout.micro_batch_size == 1 and plan.layout.grad_accum == 4  # nothing fits 0.05 GiB: the smallest


def test_layout_refuses_what_is_not_a_layout():
    with pytest.raises(ValueError, match="dp_replicate=3 does not divide dp=4"):
        Layout(tp=1, pp=1, dp=4, dp_replicate=3)
    with pytest.raises(ValueError, match="grad_accum must be >= 1"):
        Layout(tp=1, pp=1, dp=1, grad_accum=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Layout(tp=1, pp=1, dp=1).tp = 2

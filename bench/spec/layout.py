"""The parallel layout ``tp x cp x dp x pp = world_size``: pure functions, no processes.

The dimensions are declared once, in ``DIMS`` (outermost first); everything that names them (the rank order,
the DeviceMesh, the topology's groups) iterates it.  Rank order is Megatron-core's default
(``initialize_model_parallel(order="tp-cp-ep-dp-pp")`` with ep = 1): tensor-parallel rank varies fastest,
then context-parallel, then data-parallel, then pipeline::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

so the ranks of one tensor-parallel group are adjacent (same node, fastest links) and a
pipeline stage is a contiguous block of tp * cp * dp ranks.  The torch-native implementation
builds its DeviceMesh with the same order (shape ``(pp, dp, cp, tp)``), so a given rank has
the same coordinates under both implementations.

Token accounting (what ``Strategy.tokens_this_rank`` reports): every data-parallel replica
processes its slice of the global batch once; within a replica the tensor-parallel ranks
share the same tokens, the context-parallel ranks each hold 1/cp of every sequence, and only the
last pipeline stage sees the loss, so the ranks with ``tp_rank == 0`` on the last pipeline stage
count their own tokens.  The run's tokens (sum over ranks) are then the global batch, counted once.
"""
from __future__ import annotations

import math

import re
from dataclasses import dataclass, replace
from typing import Any


# the layout's dimensions, outermost first (the rank order and the DeviceMesh's dims)
DIMS = ("pp", "dp", "cp", "tp")


@dataclass(frozen=True)
class Coord:
    dp: int
    pp: int
    tp: int
    cp: int = 0


@dataclass(frozen=True)
class Layout:
    """A run's parallel layout, torchtitan's ``ParallelDims``: built once by validation
    (bench/spec/layout_rules.py ``build``) from the strategy's knobs, read as ``plan.layout`` everywhere.

    dp is split as dp_replicate replicas x dp_shard ranks (HSDP; dp_replicate = 1: every data-parallel
    rank shares the sharded states); ``schedule`` is resolved (no ``auto``); ``grad_accum`` is the
    micro-batches per step on one data-parallel rank, ``micro_batch_size`` the sequences in each.  The
    defaults are a rank map's: Layout(tp, pp, dp) is enough for coordinates."""

    tp: int
    pp: int
    dp: int
    dp_replicate: int = 1
    cp: int = 1
    virtual_pipeline: int = 1
    schedule: str = "1f1b"
    micro_batch_size: int = 1
    grad_accum: int = 1
    recompute: str = "none"
    recompute_every: int = 1
    loss_chunks: int = 1  # the loss over this many checkpointed chunks of tokens (bench/models/model.py Head)
    offload_activations: bool = False  # each block's saved tensors in host memory (bench/parallel/ac.py)

    def __post_init__(self):
        for k in ("tp", "pp", "dp", "cp", "dp_replicate", "virtual_pipeline", "micro_batch_size", "grad_accum",
                  "recompute_every", "loss_chunks"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if self.dp % self.dp_replicate:
            raise ValueError(f"dp_replicate={self.dp_replicate} does not divide dp={self.dp}")

    def checkpointed(self, blocks: float) -> float:
        """How many of a stage's ``blocks`` are checkpointed (their forward run again in backward): all under
        recompute=full, every ``recompute_every``-th of them (the first included), none otherwise."""
        return checkpointed_blocks(self.recompute, self.recompute_every, blocks)

    @property
    def dp_shard(self) -> int:
        """Data-parallel ranks of one replica (all dp ranks unless HSDP)."""
        return self.dp // self.dp_replicate

    @property
    def state_shards(self) -> int:
        """Ranks that share one copy of the sharded model states: a replica's data-parallel ranks times the
        context-parallel ranks of each (FSDP2 shards over dp x cp, bench/parallel/mesh.py data_mesh)."""
        return self.dp_shard * self.cp

    @property
    def per_rank_batch(self) -> int:
        """Sequences per step on one data-parallel rank."""
        return self.micro_batch_size * self.grad_accum

    def with_micro_batch(self, b: int) -> "Layout":
        """The same per-rank batch in micro-batches of ``b`` (micro_batch_size=auto tries several)."""
        return replace(self, micro_batch_size=b, grad_accum=self.per_rank_batch // b)

    @property
    def world_size(self) -> int:
        return math.prod(self.mesh_shape)

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """DeviceMesh shape for dim names ``DIMS`` (row-major = this rank order)."""
        return tuple(getattr(self, d) for d in DIMS)

    def coords(self, rank: int) -> Coord:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of {self.world_size}")
        out, rest = {}, rank
        for d in reversed(DIMS):  # innermost varies fastest
            out[d], rest = rest % getattr(self, d), rest // getattr(self, d)
        return Coord(**out)

    def counts_tokens(self, c: Coord) -> bool:
        """The one rank per data-parallel replica that reports tokens and loss."""
        return c.tp == 0 and c.pp == self.pp - 1

    def tokens_this_rank(self, rank: int, global_batch: int, seq_len: int) -> int:
        return global_batch // self.dp * seq_len // self.cp if self.counts_tokens(self.coords(rank)) else 0


# --------------------------------------------------------------------------- micro-batches
_MICRO = re.compile(r"^\s*(\d*)\s*p\s*$")


def resolve_microbatches(value: Any, pp: int) -> int:
    """``"p"`` -> pp, ``"4p"`` -> 4 * pp, ``8`` or ``"8"`` -> 8.  Raises ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"not a micro-batch count: {value!r}")
    if isinstance(value, int):
        m = value
    elif isinstance(value, str):
        s = value.strip().lower()
        mt = _MICRO.match(s)
        if mt:
            m = (int(mt.group(1)) if mt.group(1) else 1) * pp
        elif s.isdigit():
            m = int(s)
        else:
            raise ValueError(f"not a micro-batch count: {value!r}")
    else:
        raise ValueError(f"not a micro-batch count: {value!r}")
    if m < 1:
        raise ValueError(f"micro-batch count must be >= 1, got {m}")
    return m


# --------------------------------------------------------------------------- pipeline stages
def local_stages(pp_rank: int, pp: int, virtual: int = 1) -> list[int]:
    """Global stage ids held by a pipeline rank: r, r + pp, r + 2 pp, ... (Megatron's and
    torch's interleaved placement; one stage per rank when virtual == 1)."""
    return [pp_rank + i * pp for i in range(virtual)]


def stage_layers(stage: int, n_layers: int, n_stages: int) -> range:
    """Transformer layers (0-based) of a global pipeline stage; layers split evenly."""
    if n_layers % n_stages:
        raise ValueError(f"{n_layers} layers do not split evenly into {n_stages} stages")
    k = n_layers // n_stages
    return range(stage * k, (stage + 1) * k)


def resolve_schedule(schedule: str, virtual: int) -> str:
    """``auto`` -> ``interleaved_1f1b`` with virtual stages, else ``1f1b``."""
    if schedule == "auto":
        return "interleaved_1f1b" if virtual > 1 else "1f1b"
    return schedule


TOKEN_RULE = ("one rank per data-parallel replica counts its slice of the global batch: tensor-parallel "
              "rank 0 on the last pipeline stage (other ranks count 0 and report no loss)")
CP_TOKEN_RULE = ("each context-parallel rank of a data-parallel replica counts its 1/cp of the replica's tokens "
                 "(tensor-parallel rank 0 on the last pipeline stage; other ranks count 0 and report no loss)")


def checkpointed_blocks(recompute: str, every: int, blocks: float) -> float:
    """Blocks 0, k, 2k, ... of ``blocks`` checkpointed under recompute=full (bench/parallel/ac.py): ceil(blocks / k)."""
    if recompute != "full":
        return 0.0
    return float(math.ceil(blocks / every)) if float(blocks).is_integer() else blocks / every

"""The deterministic synthetic token stream.

Global batch ``n`` is drawn from a generator seeded by ``(seed, n)`` alone, so it is
bit-identical for every strategy, world size and rank; data-parallel rank ``r`` of ``dp``
takes rows ``[r*B/dp, (r+1)*B/dp)``.  Token ids are uniform over the vocabulary, so no
model can beat ln(vocab) on it: a loss far below that means batches repeat.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from bench.spec.schema import ModelConfig

if TYPE_CHECKING:  # imported where a batch is drawn: the command reads loss_note without loading torch
    import torch

_STREAM_SALT = 0x5EED_BA7C  # keeps batch seeds apart from the model-init seed


def global_batch(n: int, *, seed: int, vocab_size: int, seq_len: int, batch: int) -> torch.Tensor:
    """Global batch n: int64 ids of shape [batch, seq_len + 1] (inputs and shifted targets)."""
    import torch

    g = torch.Generator().manual_seed((seed * 1_000_003 + n) ^ _STREAM_SALT)
    return torch.randint(0, vocab_size, (batch, seq_len + 1), generator=g)


def loss_note(vocab_size: int) -> str:
    """Why a run's loss does not fall: said where the loss is reported, so a flat or rising loss reads as expected."""
    return (f"synthetic uniform tokens over {vocab_size} ids (bench/models/data.py): the loss stays near ln({vocab_size}) = "
            f"{math.log(vocab_size):.2f}, up or down by noise; no model can learn them")


class SyntheticStream:
    """This rank's slices of the global batches, pre-generated onto the device so the
    timed window measures training, not data generation."""

    def __init__(self, model: ModelConfig, *, seed: int, steps: int, dp_rank: int, dp_size: int,
                 device: str | torch.device):
        b = model.global_batch
        lo, hi = dp_rank * b // dp_size, (dp_rank + 1) * b // dp_size
        self._batches = []
        for n in range(steps):
            t = global_batch(n, seed=seed, vocab_size=model.vocab_size,
                             seq_len=model.seq_len, batch=b)[lo:hi]
            # contiguous inputs and targets (torch.distributed.pipelining checks input strides)
            self._batches.append((t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)))

    def __getitem__(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of this rank's slice of global batch n."""
        return self._batches[n]

    def micro_batches(self, n: int, micro_batch_size: int):
        x, y = self[n]
        return list(zip(x.split(micro_batch_size), y.split(micro_batch_size)))

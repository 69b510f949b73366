"""Batches of token windows, sharded by data-parallel rank, that resume exactly.

Step s's batch is `batch` windows of `seq + 1` tokens (inputs, and targets one
token on) at offsets drawn from a generator seeded by (seed, s), as nanoGPT draws
them. Every rank draws the same offsets, a few integers, and reads only the rows
of its data-parallel share: dp rank d the rows d x b to (d + 1) x b, b = batch /
dp, straight from the corpus's token file (a memory map: the bytes of other
ranks' rows are never read). One process reads every row (`dp=1`) and so trains
on the same batch as the whole world together.

The sampler's state is its next step (`state_dict`): a checkpoint keeps it, and a
run resumed from it, on any layout, reads what an uninterrupted run reads. The
held-out windows of the eval loss (`held_out`) are drawn once, from a fixed seed,
so every eval sees the same ones.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from distcourse.arguments import positive_int

EVAL_SEED = 999_983  # the held-out windows' seed, apart from any run's


def windows(tokens: object, starts: Tensor, seq: int) -> tuple[Tensor, Tensor]:
    """Inputs and targets (rows, seq) int64 of the windows at `starts` of
    `tokens` (a tensor or a numpy array / memmap of ids)."""
    if isinstance(tokens, Tensor):
        rows = tokens[starts[:, None] + torch.arange(seq + 1)].long()
    else:
        at = starts.numpy()
        rows = torch.from_numpy(
            np.stack([tokens[a : a + seq + 1] for a in at]).astype(np.int64)
        )
    return rows[:, :-1], rows[:, 1:]


def offsets(length: int, count: int, seq: int, seed: int) -> Tensor:
    """`count` window starts in [0, length - seq), from a generator seeded by
    `seed`."""
    if seq + 1 > length:
        raise ValueError(f"seq={seq} needs {seq + 1} tokens; the split has {length}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, length - seq, (count,), generator=gen)


class Sampler:
    """This rank's rows of each step's batch of `tokens`; `next(sampler)` gives
    (inputs, targets), each (batch / dp, seq) int64 on the host, and counts."""

    def __init__(
        self,
        tokens: object,
        batch: int,
        seq: int,
        *,
        seed: int = 0,
        dp: int = 1,
        rank: int = 0,
    ) -> None:
        positive_int(batch, "batch")
        positive_int(seq, "seq")
        if batch % dp:
            raise ValueError(f"a batch of {batch} does not split into dp={dp} shares")
        self.tokens, self.batch, self.seq, self.seed = tokens, batch, seq, seed
        self.dp, self.rank, self.step = dp, rank, 0

    @property
    def rows(self) -> slice:
        """This rank's rows of a step's batch."""
        b = self.batch // self.dp
        return slice(self.rank * b, (self.rank + 1) * b)

    def at(self, step: int) -> tuple[Tensor, Tensor]:
        """Step `step`'s rows of this rank (no state changes)."""
        if step < 0:
            raise ValueError(f"step={step} must be 0 or more")
        starts = offsets(
            len(self.tokens), self.batch, self.seq, self.seed * 1_000_003 + step
        )
        return windows(self.tokens, starts[self.rows], self.seq)

    def __iter__(self) -> Sampler:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        batch = self.at(self.step)
        self.step += 1
        return batch

    def state_dict(self) -> dict:
        """What resumes it: the next step, and what the batches depend on."""
        return dict(step=self.step, seed=self.seed, batch=self.batch, seq=self.seq)

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state`; ValueError if it was another sampler's."""
        for key in ("seed", "batch", "seq"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state[key]}, this run's is "
                    f"{getattr(self, key)}"
                )
        self.step = int(state["step"])


def held_out(
    tokens: object, batches: int, batch: int, seq: int, dp: int = 1, rank: int = 0
) -> list[tuple[Tensor, Tensor]]:
    """`batches` fixed batches of the held-out `tokens`, this rank's rows of each
    (the same windows at every eval and on every layout)."""
    sampler = Sampler(tokens, batch, seq, seed=EVAL_SEED, dp=dp, rank=rank)
    return [sampler.at(i) for i in range(batches)]

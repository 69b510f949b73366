"""Who owns which parameter under ZeRO, and the flat padded row that moves them.

torch's `ZeroRedundancyOptimizer` gives each rank whole parameters, sorted-greedy:
largest first, each to the rank holding the fewest elements so far (ties to the lowest
rank), group by group with the running sizes carried over. We partition the same way,
so both optimizers put the same parameters on the same ranks and their state dicts
index alike.

Moving shards: rank r's parameters, flattened one after another, make its segment of
`numel[r]` elements. Segments differ in length (whole parameters rarely split evenly),
and `all_gather_into_tensor` / `reduce_scatter_tensor` need equal pieces, so every
segment is padded to the longest, `width` elements: one collective of
`world x width` elements moves every shard. The padding is the price of keeping
parameters whole; `Partition.padding` says how much it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def greedy(groups: Sequence[Sequence[Tensor]], world: int) -> list[list[list[Tensor]]]:
    """[rank][group] -> the parameters that rank owns, torch's sorted-greedy way."""
    owned: list[list[list[Tensor]]] = [[[] for _ in groups] for _ in range(world)]
    sizes = [0] * world
    for g, params in enumerate(groups):
        for param in sorted(params, key=lambda t: t.numel(), reverse=True):
            rank = sizes.index(min(sizes))  # the first rank with the least
            owned[rank][g].append(param)
            sizes[rank] += param.numel()
    return owned


class Partition:
    """The parameters of every group, split over `world` ranks, and their flat rows."""

    def __init__(self, groups: Sequence[Sequence[Tensor]], world: int) -> None:
        self.world = world
        self.by_rank = greedy(groups, world)  # [rank][group] -> parameters
        self.flat = [[p for g in groups_ for p in g] for groups_ in self.by_rank]
        self.numel = [sum(p.numel() for p in mine) for mine in self.flat]
        self.width = max(self.numel)  # every segment is padded to this

    @property
    def padding(self) -> int:
        """Elements of padding in one all-gather: world x width - what is real."""
        return self.world * self.width - sum(self.numel)

    def owner(self) -> dict[Tensor, int]:
        """Each parameter's rank (keys by identity: tensors hash by id)."""
        return {p: r for r, mine in enumerate(self.flat) for p in mine}

    def row(self, tensors_by_rank: Sequence[Sequence[Tensor]], like: Tensor) -> Tensor:
        """`world x width` elements: each rank's tensors, flattened, then padding."""
        out = torch.zeros(self.world, self.width, dtype=like.dtype, device=like.device)
        for r, tensors in enumerate(tensors_by_rank):
            if tensors:
                flat = torch.cat([t.reshape(-1) for t in tensors])
                out[r, : flat.numel()] = flat
        return out

    def unpack(self, segment: Tensor, rank: int) -> list[Tensor]:
        """Rank `rank`'s tensors, shaped as its parameters, read from its segment."""
        pieces, at = [], 0
        for p in self.flat[rank]:
            pieces.append(segment[at : at + p.numel()].view_as(p))
            at += p.numel()
        return pieces

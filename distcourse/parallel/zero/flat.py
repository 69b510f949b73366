"""The flat layout ZeRO runs on in DeepSpeed and Megatron: even pieces of one buffer.

Every trainable parameter, flattened, goes into one buffer, in backward order (last
parameter first, `parallel.buckets.assign_buckets`), cut into buckets of about
`cap_bytes`. Each bucket is a region padded to a multiple of the world size N, so
its reduce-scatter and its all-gather split it evenly: rank r owns elements
`[r s, (r + 1) s)` of every region, `s = size / N`. A parameter may straddle two
ranks' pieces, as in DeepSpeed's flat partitions (ZeRO paper §5.1, §5.2) and
Megatron's distributed optimizer, which shards each bucket the same way. With one
bucket (a cap larger than the model) rank r owns one contiguous 1/N slice of the
whole buffer.

Whole-parameter shares (`partition.py`, torch's `ZeroRedundancyOptimizer`) pad every
share to the largest; even pieces pad each region by fewer than N elements.
Everything here is arithmetic on shapes: no rank, no communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from distcourse.parallel.buckets import assign_buckets


@dataclass(frozen=True)
class Region:
    """One bucket of the flat buffer: `size` elements from `start`, real ones first."""

    index: int
    start: int  # its first element in the flat buffer
    size: int  # elements, padded to a multiple of the world size
    params: tuple[int, ...]  # indices of its parameters, in the order laid out
    offsets: tuple[int, ...]  # each of those parameters' first element (flat)
    numels: tuple[int, ...]  # each of those parameters' elements

    @property
    def real(self) -> int:
        """Elements that are parameters (the rest, fewer than N, are padding)."""
        return sum(self.numels)

    def piece(self, rank: int, world: int) -> slice:
        """Rank `rank`'s even piece of this region, as a slice of the flat buffer."""
        share = self.size // world
        return slice(self.start + rank * share, self.start + (rank + 1) * share)

    def span(self) -> slice:
        """The whole region, as a slice of the flat buffer."""
        return slice(self.start, self.start + self.size)


class FlatLayout:
    """Where every parameter lives in the flat buffer, bucket by bucket.

    `params`: the trainable parameters in module order (one dtype and device);
    `world`: the ranks sharing it; `cap_bytes`: a bucket closes once it holds that
    many bytes (a large parameter overshoots, as in DDP). `padded` is the flat
    buffer's length, Ψ padded region by region; `numel` is Ψ.
    """

    def __init__(self, params: Sequence[Tensor], world: int, cap_bytes: int) -> None:
        if world < 1:
            raise ValueError(f"FlatLayout: world must be at least 1, got {world}")
        self.world = world
        self.numel = sum(p.numel() for p in params)
        self.shapes = [tuple(p.shape) for p in params]
        self.regions: list[Region] = []
        start = 0
        for k, indices in enumerate(assign_buckets(list(params), cap_bytes)):
            numels = tuple(params[i].numel() for i in indices)
            offsets = tuple(start + sum(numels[:j]) for j in range(len(numels)))
            size = -(-sum(numels) // world) * world  # rounded up to a multiple of N
            self.regions.append(Region(k, start, size, tuple(indices), offsets, numels))
            start += size
        self.padded = start
        self.where = {  # parameter index -> (region index, its first flat element)
            i: (r.index, at)
            for r in self.regions
            for i, at in zip(r.params, r.offsets, strict=True)
        }

    @property
    def share(self) -> int:
        """Elements each rank owns: padded / N (the same on every rank)."""
        return self.padded // self.world

    def view(self, flat: Tensor, index: int) -> Tensor:
        """Parameter `index`'s elements of `flat`, shaped like the parameter."""
        _, at = self.where[index]
        shape = self.shapes[index]
        return flat[at : at + torch.Size(shape).numel()].view(shape)

    def flatten(self, tensors: Sequence[Tensor]) -> Tensor:
        """One flat buffer of `padded` elements holding `tensors` (shaped like the
        parameters), zeros in the padding: a model's values or gradients laid out."""
        like = tensors[0]
        flat = torch.zeros(self.padded, dtype=like.dtype, device=like.device)
        for i, tensor in enumerate(tensors):
            self.view(flat, i).copy_(tensor)
        return flat

    def pieces(self, flat: Tensor, rank: int) -> Tensor:
        """Rank `rank`'s pieces of `flat`, region after region, in one tensor."""
        return torch.cat([flat[r.piece(rank, self.world)] for r in self.regions])

    def step_bytes(self, element_size: int = 4) -> int:
        """Wire bytes per rank of one step, the book's ring convention: every
        region reduce-scattered, then all-gathered, (N-1)/N of it each:
        2(N-1)/N x padded, what DP's all-reduce moves (ZeRO paper §7.2.1)."""
        return 2 * (self.world - 1) * self.share * element_size

    def peak_gradient_bytes(self, stage: int, element_size: int = 4) -> int:
        """Full-size gradient bytes alive at once in backward, by stage.

        Stage 1 keeps the whole flat gradient (padded). Stage 2 holds one region's
        bucket at a time, and while a gradient is copied in, that gradient too:
        the largest of (region + its largest parameter)."""
        if stage == 1:
            return self.padded * element_size
        if stage != 2:
            raise ValueError(f"FlatLayout: stage must be 1 or 2, got {stage}")
        return element_size * max(r.size + max(r.numels) for r in self.regions)

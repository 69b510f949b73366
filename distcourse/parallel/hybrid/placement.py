"""Where a rank's tensors sit in the one-process model: a box of each whole tensor.

Every tensor a rank of the hybrid runner holds (a parameter, its gradient, an
optimizer moment) is a rectangular part of one tensor of the one-process TinyGPT:
a `Box` names that tensor (its state-dict key), its whole shape, and the part's
offsets and sizes. Tensor parallelism cuts one dim evenly (a column layer's rows,
a row layer's columns, the embedding's vocabulary rows), FSDP then keeps a run of
rows of that slice (`torch.chunk`'s dim-0 piece), and ZeRO's flat pieces hold a
run of a parameter's elements, which a box of whole rows plus at most two partial
rows covers. Nothing is gathered to know it: the shapes say it.

Two uses, one description: a checkpoint writes each box where it belongs in the
whole tensor (DCP's chunks: `train.checkpoint`), so any layout reads it back, and
`--compare` checks each box against the same part of one process's tensor, so no
rank gathers a model to compare it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from distcourse.parallel.hybrid.stages import layer_prefix


@dataclass(frozen=True)
class Box:
    """The part of one-process tensor `name` (of shape `shape`) that a local tensor
    holds: `sizes` elements along each dim from `offsets`."""

    name: str
    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @classmethod
    def whole(cls, name: str, shape: tuple[int, ...]) -> Box:
        """All of the tensor."""
        return cls(name, tuple(shape), (0,) * len(shape), tuple(shape))

    def of(self, full: Tensor) -> Tensor:
        """This part of the whole tensor `full` (a view)."""
        if tuple(full.shape) != self.shape:
            raise ValueError(f"{self.name}: shape {list(full.shape)}, not {self.shape}")
        index = tuple(
            slice(o, o + s) for o, s in zip(self.offsets, self.sizes, strict=True)
        )
        return full[index]

    @property
    def numel(self) -> int:
        """Elements in the part."""
        return int(torch.Size(self.sizes).numel())

    def split(self, dim: int, index: int, parts: int) -> Box:
        """Part `index` of `parts` equal ones along `dim` (tensor parallelism)."""
        size = self.sizes[dim] // parts
        offsets = list(self.offsets)
        offsets[dim] += index * size
        sizes = list(self.sizes)
        sizes[dim] = size
        return replace(self, offsets=tuple(offsets), sizes=tuple(sizes))

    def rows(self, start: int, count: int) -> Box:
        """`count` rows of this part from its row `start` (an FSDP piece)."""
        return replace(
            self,
            offsets=(self.offsets[0] + start, *self.offsets[1:]),
            sizes=(count, *self.sizes[1:]),
        )

    def runs(self, start: int, stop: int) -> list[Box]:
        """Elements [start, stop) of this part, in row-major order, as boxes: a
        partial first row, whole rows, a partial last row (a ZeRO flat piece).
        Parts of 1 or 2 dims (every TinyGPT parameter)."""
        if start >= stop:
            return []
        if len(self.sizes) == 1:
            offsets = (self.offsets[0] + start,)
            return [replace(self, offsets=offsets, sizes=(stop - start,))]
        if len(self.sizes) != 2:
            raise ValueError(f"{self.name}: runs of 1-d or 2-d parts only")
        width, out = self.sizes[1], []
        row, col = divmod(start, width)
        if col:  # a partial first row
            count = min(width - col, stop - start)
            out.append(self._cells(row, col, count))
            start, row = start + count, row + 1
        whole = (stop - start) // width
        if whole:
            out.append(self.rows(row, whole))
            start, row = start + whole * width, row + whole
        if start < stop:  # a partial last row
            out.append(self._cells(row, 0, stop - start))
        return out

    def overlap(self, other: Box) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
        """Where this part and `other` (of the same tensor) share elements, as
        slices of each part's own tensor; None if they share none."""
        mine, theirs = [], []
        for o, s, p, q in zip(
            self.offsets, self.sizes, other.offsets, other.sizes, strict=True
        ):
            lo, hi = max(o, p), min(o + s, p + q)
            if lo >= hi:
                return None
            mine.append(slice(lo - o, hi - o))
            theirs.append(slice(lo - p, hi - p))
        return tuple(mine), tuple(theirs)

    def _cells(self, row: int, col: int, count: int) -> Box:
        """`count` cells of one row of a 2-d part, from column `col`."""
        return replace(
            self,
            offsets=(self.offsets[0] + row, self.offsets[1] + col),
            sizes=(1, count),
        )


def stage_boxes(
    stage: nn.Sequential,
    twin: nn.Sequential,
    first: int,
    n_layer: int,
    tp_rank: int,
    tp: int,
) -> list[Box]:
    """Each parameter's Box, in `stage.parameters()` order: `stage` holds this
    rank's TP slices (or whole layers), `twin` the same layers whole (on meta),
    `first` the chain index of the stage's first layer. A parameter whose shape
    differs from its twin's in one dim is that dim's slice `tp_rank` of `tp`."""
    boxes = []
    for i, (layer, whole) in enumerate(zip(stage, twin, strict=True)):
        prefix = layer_prefix(first + i, n_layer)
        mine = dict(layer.named_parameters())
        for name, full in whole.named_parameters():
            p = mine[name]
            box = Box.whole(prefix + name, tuple(full.shape))
            cut = [
                d
                for d, (a, b) in enumerate(zip(p.shape, full.shape, strict=True))
                if a != b
            ]
            if len(cut) > 1 or (cut and p.shape[cut[0]] * tp != full.shape[cut[0]]):
                raise ValueError(
                    f"{prefix + name}: {list(p.shape)} is not a TP slice of "
                    f"{list(full.shape)} over {tp} ranks"
                )
            boxes.append(box.split(cut[0], tp_rank, tp) if cut else box)
    return boxes


def replicated(boxes: list[Box]) -> list[bool]:
    """Which boxes are whole tensors (held alike by every TP rank)."""
    return [b.sizes == b.shape for b in boxes]

"""FSDP2's layout: a parameter cut along dim 0 by `torch.chunk`, padded to equal pieces.

A (d0, ...) parameter on N ranks: every piece has `chunk = ceil(d0 / N)` rows but the
last ones, which may have fewer or none (`torch.chunk(torch.zeros(5, 3), 4)` gives
2, 2, 1 rows and nothing for a fourth rank). Collectives need equal pieces, so each
piece travels padded to `chunk` rows; a unit's pieces, one after another, make this
rank's segment of `Unit.width` elements, and one collective moves all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Piece:
    """Where one parameter lives: its full shape, its rows, its place in a segment."""

    shape: torch.Size  # the full parameter's
    world: int
    rank: int
    offset: int  # elements before it in the unit's segment

    @property
    def chunk(self) -> int:
        """Rows of every padded piece."""
        return math.ceil(self.shape[0] / self.world)

    @property
    def rows(self) -> int:
        """Rows this rank really holds: torch.chunk's piece, possibly empty."""
        return max(0, min(self.chunk, self.shape[0] - self.rank * self.chunk))

    @property
    def row_numel(self) -> int:
        """Elements in one row."""
        return math.prod(self.shape[1:])

    @property
    def padded(self) -> int:
        """Elements of one padded piece (this parameter's part of a segment)."""
        return self.chunk * self.row_numel

    def cut(self, full: Tensor) -> Tensor:
        """This rank's rows of the full parameter (a copy, FSDP2's local tensor)."""
        start = self.rank * self.chunk
        return full.detach()[start : start + self.rows].clone()

    def pad(self, rows: Tensor) -> Tensor:
        """A piece of `rows` rows as `padded` elements (zeros after the real rows)."""
        out = rows.new_zeros(self.padded)
        out[: rows.numel()] = rows.reshape(-1)
        return out

    def full_padded(self, full: Tensor) -> Tensor:
        """The full tensor padded to `world x chunk` rows: row r x chunk is rank r's."""
        out = full.new_zeros((self.world * self.chunk, *self.shape[1:]))
        out[: self.shape[0]] = full
        return out.view(self.world, self.padded)


def pieces(shapes: list[torch.Size], world: int, rank: int) -> list[Piece]:
    """Every parameter's Piece, laid one after another in the segment."""
    out, offset = [], 0
    for shape in shapes:
        piece = Piece(torch.Size(shape), world, rank, offset)
        out.append(piece)
        offset += piece.padded
    return out

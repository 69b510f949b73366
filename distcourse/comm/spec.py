"""TensorSpec: a tensor's shape and dtype, and the integers that carry them to a peer.

Before any data moves, ranks tell each other what they hold: `agree` all-gathers it,
p2p sends it as a header, a pipeline step gathers its batch's. All three write the
same fixed-length int64 row, `TensorSpec.encode`:

    [dtype code, ndim, size 0, ..., size ndim-1, -1 padding up to MAX_DIMS sizes]

so a receiver can allocate a buffer for the row before it knows the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

MAX_DIMS = 8  # sizes a row holds; a tensor with more dims is encoded without them
# every dtype torch has, in a fixed order: a dtype's code is its index here
DTYPES: tuple[torch.dtype, ...] = tuple(
    sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
)


@dataclass(frozen=True)
class TensorSpec:
    """What a receiver must know to allocate a tensor: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    LENGTH: ClassVar[int] = 2 + MAX_DIMS  # integers in an encoded row

    @classmethod
    def of(cls, tensor: Tensor) -> TensorSpec:
        """The spec of an existing tensor."""
        return cls(tuple(tensor.shape), tensor.dtype)

    def encode(self) -> list[int]:
        """The row [dtype code, ndim, sizes..., -1 padding]; sizes left out (all -1)
        when there are more than MAX_DIMS of them, so such tensors compare by ndim."""
        shape = list(self.shape) if len(self.shape) <= MAX_DIMS else []
        return [DTYPES.index(self.dtype), len(self.shape), *shape] + [-1] * (
            MAX_DIMS - len(shape)
        )

    @classmethod
    def decode(cls, row: list[int]) -> TensorSpec | None:
        """The spec a row encodes; None if the row is not one `encode` writes."""
        if len(row) != cls.LENGTH:
            return None
        code, ndim, *sizes = row
        if not 0 <= code < len(DTYPES) or not 0 <= ndim <= MAX_DIMS:
            return None
        if any(s < 0 for s in sizes[:ndim]) or any(s != -1 for s in sizes[ndim:]):
            return None
        return cls(tuple(sizes[:ndim]), DTYPES[code])

    def __str__(self) -> str:
        """E.g. "float32[4, 8]"."""
        return f"{str(self.dtype).removeprefix('torch.')}{list(self.shape)}"

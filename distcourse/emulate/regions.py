"""Byte ranges of host storages, each held by an issued op (`completion.Pending`).

Buffers are often views of one flat storage (a ring's pieces, ZeRO's and FSDP's flat
buffers): an op may send one piece while the program writes the next. So what an op
holds is the bytes its tensor spans in its storage, and two tensors clash only where
those bytes overlap, not wherever they share a storage.
"""

from __future__ import annotations

from typing import Any

import torch


def span(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage address, first byte, one past the last byte) that `t` spans, or None
    for a tensor with no data."""
    if t.numel() == 0:
        return None
    try:
        key = t.untyped_storage().data_ptr()
    except RuntimeError:  # no storage of its own
        return None
    if not key:
        return None
    size = t.element_size()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    start = t.storage_offset() * size
    return key, start, start + (last + 1) * size


class Regions:
    """Who holds which bytes: `add(t, owner)`, `owner(t)` (of any overlapping
    bytes), `drop(owner)`."""

    def __init__(self) -> None:
        self._by_storage: dict[int, list[tuple[int, int, Any]]] = {}

    def add(self, t: torch.Tensor, owner: Any) -> bool:
        """Hold `t`'s bytes for `owner`; False if `t` has none."""
        where = span(t)
        if where is None:
            return False
        key, lo, hi = where
        self._by_storage.setdefault(key, []).append((lo, hi, owner))
        return True

    def owner(self, t: Any) -> Any:
        """The owner of bytes `t` overlaps, or None."""
        where = span(t) if isinstance(t, torch.Tensor) and self._by_storage else None
        if where is None:
            return None
        key, lo, hi = where
        for a, b, owner in self._by_storage.get(key, ()):
            if a < hi and lo < b:
                return owner
        return None

    def drop(self, owner: Any) -> None:
        """Free every range `owner` holds."""
        for key in list(self._by_storage):
            kept = [r for r in self._by_storage[key] if r[2] is not owner]
            if kept:
                self._by_storage[key] = kept
            else:
                del self._by_storage[key]

    def owners(self) -> set:
        return {r[2] for ranges in self._by_storage.values() for r in ranges}

    def __bool__(self) -> bool:
        return bool(self._by_storage)

"""Reading an op's arguments by their names in its schema (for the emulated device):
where its `device` is, which tensors it writes, whether it is non-blocking; and the
ops that only ask for sizes (no device work, no read of a buffer).

Most ops that make a tensor take `device` as a keyword; a few take it by position
(`aten.to.device(self, device, dtype, ...)`, which reaches the device's dispatch under
DTensor's loss_parallel). `device_by_name` moves such an argument into the keywords, so
the device's dispatch finds every `device` in one place.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

_aten = torch.ops.aten
SHAPE_QUERIES = {  # a wrapper's geometry is its host data's, whatever ran in place
    _aten.sym_size.default: torch.Tensor.size,
    _aten.sym_stride.default: torch.Tensor.stride,
    _aten.sym_numel.default: torch.Tensor.numel,
    _aten.sym_storage_offset.default: torch.Tensor.storage_offset,
    _aten.dim.default: torch.Tensor.dim,
}
METADATA = {  # ops that read no data: not device work, not a read of a buffer
    _aten.is_contiguous.default,
    _aten.is_contiguous.memory_format,
    _aten.is_non_overlapping_and_dense.default,
    _aten.is_strides_like_format.default,
    _aten.detach.default,
    _aten.alias.default,
}


def device_by_name(func: Any, args: list, kwargs: dict) -> tuple[list, dict]:
    """Move a positional `device` argument (`aten.to.device(self, device, ...)`,
    which reaches the dispatch under DTensor's loss_parallel) into the keywords."""
    i = positional_device(func)
    if i is None or i >= len(args):
        return args, kwargs
    names = [a.name for a in func._schema.arguments[i:]]
    return args[:i], {**kwargs, **dict(zip(names, args[i:], strict=False))}


@functools.cache
def positional_device(func: Any) -> int | None:
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "device" and not arg.kwarg_only:
            return i
    return None


@functools.cache
def _written_arguments(func: Any) -> tuple[tuple[int, str], ...]:
    """(position, name) of each argument `func` writes (Tensor(a!) in its schema)."""
    return tuple(
        (i, arg.name)
        for i, arg in enumerate(func._schema.arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    )


def written(func: Any, args: list, kwargs: dict) -> list:
    """The tensors `func` writes into (in place or out=), flattened."""
    out: list = []
    for i, name in _written_arguments(func):
        value = args[i] if i < len(args) else kwargs.get(name)
        out.extend(value if isinstance(value, list | tuple) else [value])
    return out


def non_blocking(func: Any, args: list, kwargs: dict) -> bool:
    """The op's `non_blocking` argument (False if it has none)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "non_blocking":
            return bool(args[i] if i < len(args) else kwargs.get("non_blocking"))
    return False

"""Reading an op's arguments by their names in its schema (for the emulated device).

Most ops that make a tensor take `device` as a keyword; a few take it by position
(`aten.to.device(self, device, dtype, ...)`, which reaches the device's dispatch under
DTensor's loss_parallel). `device_by_name` moves such an argument into the keywords, so
the device's dispatch finds every `device` in one place.
"""

from __future__ import annotations

import functools
from typing import Any


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

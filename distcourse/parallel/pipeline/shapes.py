"""What each stage receives, found before anything is sent.

Every rank holds the whole split, so every rank can push a micro-batch through all
stages on the "meta" device: meta tensors carry shapes and dtypes but no data, and
the stages run as copies whose parameters and buffers are on meta too (made without
copying any data), so nothing real is computed or changed (BatchNorm's running
statistics included). A stage that cannot take the previous stage's output fails
here, on every rank alike, naming both stages. The first call imports the Python
meta kernels (torch._dynamo among them): a second or two, once per process.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

Shape = tuple[torch.Size, torch.dtype]


def stage_shapes(
    stages: Sequence[nn.Module],
    micro_shape: Sequence[int],
    dtype: torch.dtype,
    describe: Callable[[int], str] = lambda s: f"stage {s}",
) -> list[Shape]:
    """(shape, dtype) of each stage's input, then of the last stage's output."""
    found: list[Shape] = [(torch.Size(micro_shape), dtype)]
    x = torch.empty(tuple(micro_shape), dtype=dtype, device="meta")
    for s, stage in enumerate(stages):
        try:
            with torch.no_grad():
                x = on_meta(stage)(x)
        except Exception as err:
            got = f"{str(found[-1][1]).removeprefix('torch.')}{list(found[-1][0])}"
            after = f"the output of {describe(s - 1)}" if s else "the input"
            raise ValueError(
                f"{describe(s)} cannot take {after}, {got}: {type(err).__name__}: {err}"
            ) from None
        if not isinstance(x, torch.Tensor):
            raise ValueError(
                f"{describe(s)} returns {type(x).__name__}; a pipeline "
                "stage must return one tensor"
            )
        found.append((x.shape, x.dtype))
    return found


def on_meta(module: nn.Module) -> nn.Module:
    """A copy of `module` whose parameters and buffers are data-less meta tensors."""
    memo: dict[int, object] = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(p.detach().to("meta"), p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = b.to("meta")
    return copy.deepcopy(module, memo)

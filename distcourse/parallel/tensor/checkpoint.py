"""Conversions between a split layer and its one-process twin, and their checks.

A tensor-parallel layer is built from a whole nn.Linear (`from_linear`), turned back
into one (`to_linear`), and saves or loads the whole layer's state dict
(`full_state_dict`, `load_full_state_dict`), so a checkpoint loads on any number of
ranks. `ShardedLinear` holds what both parallel linears share; each says how its
weight is cut and gathered. `check_keys` refuses a state dict of another model
before anything is copied.
"""

from __future__ import annotations

from typing import Self

import torch
from torch import Tensor, nn

from distcourse.comm.agree import Group


class ShardedLinear(nn.Module):
    """What both parallel linears share: built from, and turned back into, nn.Linear.

    A subclass keeps its slice in `weight` (and `bias`) and says how a full state
    dict is cut (`load_full_state_dict`) and gathered (`full_state_dict`).
    """

    in_features: int
    out_features: int
    weight: nn.Parameter
    bias: nn.Parameter | None

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group: Group = None, **options: object
    ) -> Self:
        """This rank's slice of `linear` (which is left unchanged), on its device."""
        out, inp = linear.weight.shape
        w = linear.weight
        layer = cls(
            inp,
            out,
            linear.bias is not None,
            group=group,
            dtype=w.dtype,
            device=w.device,
            **options,
        )
        layer.load_full_state_dict(linear.state_dict())
        return layer

    def full_shapes(self) -> dict[str, tuple[int, ...]]:
        """The whole layer's parameter shapes, as nn.Linear holds them."""
        shapes = {"weight": (self.out_features, self.in_features)}
        if self.bias is not None:
            shapes["bias"] = (self.out_features,)
        return shapes

    def full_state_dict(self) -> dict[str, Tensor]:
        raise NotImplementedError

    def load_full_state_dict(self, state: dict[str, Tensor]) -> None:
        raise NotImplementedError

    def to_linear(self) -> nn.Linear:
        """The whole layer as one nn.Linear (a collective: every rank calls it)."""
        state = self.full_state_dict()
        w = self.weight
        linear = nn.Linear(
            self.in_features,
            self.out_features,
            self.bias is not None,
            dtype=w.dtype,
            device=w.device,
        )
        linear.load_state_dict(state)
        return linear


def check_keys(what: str, state: dict[str, Tensor], shapes: dict[str, tuple]) -> None:
    """ValueError unless `state` holds exactly `shapes`' keys with those full shapes."""
    if set(state) != set(shapes):
        raise ValueError(
            f"{what}: checkpoint has keys {sorted(state)}, this layer needs "
            f"{sorted(shapes)}"
        )
    for key, shape in shapes.items():
        check_shape(what, key, state[key].shape, shape)


def check_shape(what: str, key: str, got: torch.Size, want: tuple[int, ...]) -> None:
    """ValueError unless a full tensor `key` has the shape the layer expects."""
    if tuple(got) != tuple(want):
        raise ValueError(
            f"{what}: checkpoint tensor {key!r} has shape {list(got)}, this layer "
            f"needs {list(want)} (was it saved from a model of another size?)"
        )

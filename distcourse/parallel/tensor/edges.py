"""The messages inside a tensor-parallel layer, sent without a second check.

A layer decides once whether it checks: where its input enters, it agrees on the
input's TensorSpec across ranks (`check=True`, one all-gather). Everything it sends
after that is computed from that input, the same shape on every rank by
construction, so these comm.autograd collectives skip their own agreement. Each
takes the group of the layer's Members.
"""

from __future__ import annotations

from torch import Tensor

from distcourse.comm.agree import Group, members
from distcourse.comm.autograd import (
    all_gather_along,
    copy_to_group,
    gather_from_group,
    reduce_from_group,
    reduce_scatter_along,
    split_to_group,
)


def f(x: Tensor, group: Group) -> Tensor:
    """Megatron's f: identity forward, all-reduce backward (copy_to_group)."""
    return copy_to_group(x, group, check=False)


def g(x: Tensor, group: Group) -> Tensor:
    """Megatron's g: all-reduce forward, identity backward (reduce_from_group)."""
    return reduce_from_group(x, group, check=False)


def split(x: Tensor, dim: int, group: Group) -> Tensor:
    """This rank's piece of a replicated x along `dim` (split_to_group)."""
    return split_to_group(x, dim, group, check=False)


def gather(x: Tensor, dim: int, group: Group) -> Tensor:
    """Every rank's x along `dim`, replicated (gather_from_group): a layer's even
    split (`shard_size`), so every rank's piece is as long as this one's."""
    n = members(group, "gather").size
    return gather_from_group(x, dim, group, check=False, sizes=[x.size(dim)] * n)


def gather_sequence(
    x: Tensor, dim: int, group: Group, sizes: list[int] | None
) -> Tensor:
    """Sequence parallelism's f: all-gather forward, reduce-scatter backward. `sizes`:
    every rank's tokens, from the layer's agreement (None: exchanged here)."""
    return all_gather_along(x, dim, group, check=False, sizes=sizes)


def scatter_sequence(x: Tensor, dim: int, group: Group) -> Tensor:
    """Sequence parallelism's g: reduce-scatter forward, all-gather backward."""
    return reduce_scatter_along(x, dim, group, check=False)

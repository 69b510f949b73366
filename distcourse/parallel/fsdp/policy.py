"""What `fully_shard` takes beside the module, checked before any collective.

- `MixedPrecisionPolicy(param_dtype, reduce_dtype)`: torch's FSDP2 policy of the same
  name and fields. The pieces (and so the optimizer) stay in their own dtype, fp32;
  the gathered parameters are cast to `param_dtype` for forward and backward (the
  all-gather moves them in that dtype, as torch's does), and the gradients are
  reduce-scattered in `reduce_dtype` (None: `param_dtype`), then cast back to the
  pieces' dtype. torch's own class is accepted too (its `output_dtype` must be None).
- `reshard_after_forward`: True, False, None (True for a unit inside another, False
  for the root: its parameters are the first backward needs) or an int, torch's
  "world size to reshard to": 1 means False and the shard size means True; a size
  k between that divides it keeps the parameters sharded over groups of k
  consecutive ranks (torch's `mesh.view(-1, k)`), so backward gathers over k ranks,
  not N (ours: on a 1-D mesh of the whole world only).
- `mesh`: 1-D (shard over it) or 2-D (HSDP: replicate over dim 0, shard over dim 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from distcourse import runtime
from distcourse.mesh import Mesh


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """torch's `torch.distributed.fsdp.MixedPrecisionPolicy`: the dtype the gathered
    parameters compute in, and the dtype gradients are reduced in (None: keep)."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None


def mixed_precision(policy: Any) -> MixedPrecisionPolicy:
    """Ours or torch's policy, as ours; ValueError for anything else or a dtype that
    is not a floating point one (so no rank sends before every rank refuses)."""
    if policy is None:
        return MixedPrecisionPolicy()
    names = ("param_dtype", "reduce_dtype")
    if not all(hasattr(policy, n) for n in names):
        raise ValueError(
            "fully_shard: mp_policy must be a MixedPrecisionPolicy (ours or torch's), "
            f"got {policy!r}"
        )
    if getattr(policy, "cast_forward_inputs", True) is not True:
        raise ValueError(
            "fully_shard: mp_policy.cast_forward_inputs=False is not supported here "
            "(ours casts a unit's floating inputs to param_dtype, torch's default)"
        )
    if getattr(policy, "output_dtype", None) is not None:
        raise ValueError(
            "fully_shard: mp_policy.output_dtype is not supported here (outputs "
            "keep param_dtype); leave it None"
        )
    for name in names:
        dtype = getattr(policy, name)
        if dtype is not None and not (
            isinstance(dtype, torch.dtype) and dtype.is_floating_point
        ):
            raise ValueError(
                f"fully_shard: mp_policy.{name} must be a floating dtype or None, "
                f"got {dtype!r}"
            )
    return MixedPrecisionPolicy(policy.param_dtype, policy.reduce_dtype)


def reshard_setting(
    value: Any, shard_size: int, whole_world: bool = True
) -> bool | int | None:
    """`reshard_after_forward` as True, False, None (decided by rootness later) or
    the size of the smaller group to reshard to.

    An int is torch's world size to reshard to: 1 keeps the parameters gathered
    (False), the shard size reshards fully (True), a divisor in between is that
    size (`smaller_group` makes the groups). Anything else is a ValueError, as an
    int in between when the shard group is not the whole world (`whole_world`).
    """
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, int):
        raise ValueError(
            "fully_shard: reshard_after_forward must be a bool, an int or None, "
            f"got {value!r}"
        )
    if value == 1:
        return False
    if value == shard_size:
        return True
    if not 1 < value < shard_size or shard_size % value:
        raise ValueError(
            f"fully_shard: reshard_after_forward={value} must divide the shard size "
            f"{shard_size} (1 = False, {shard_size} = True)"
        )
    if not whole_world:
        raise ValueError(
            f"fully_shard: reshard_after_forward={value}: ours reshards to a smaller "
            "group only on a 1-D mesh of the whole world (torch's also on others)"
        )
    return value


def smaller_group(size: int) -> Any:
    """This rank's group among the world cut into groups of `size` consecutive
    ranks. Every rank of the world calls it (each `new_group` is a collective)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    timeout = timedelta(seconds=runtime.DEFAULT_TIMEOUT)
    mine = None
    for start in range(0, world, size):
        group = dist.new_group(list(range(start, start + size)), timeout=timeout)
        if start <= rank < start + size:
            mine = group
    return mine


def groups_of(mesh: Mesh | DeviceMesh | None) -> tuple[Any, Any]:
    """(shard group, replicate group or None) of a mesh (None: the world).

    1-D: shard over it. 2-D: HSDP, torch's order (replicate, shard): dim 0
    replicates, dim 1 shards. Anything else is a ValueError before any collective.
    """
    if mesh is None:
        return None, None
    device_mesh = mesh.device_mesh if isinstance(mesh, Mesh) else mesh
    if not isinstance(device_mesh, DeviceMesh):
        raise ValueError(
            f"fully_shard: mesh must be a Mesh, a DeviceMesh or None, got {mesh!r}"
        )
    ranks = device_mesh.mesh.flatten().tolist()
    world = dist.get_world_size()
    if device_mesh.ndim not in (1, 2):
        raise ValueError(
            f"fully_shard: the mesh must be 1-D (shard) or 2-D (replicate, shard), "
            f"got {device_mesh.ndim}-D"
        )
    if any(not 0 <= r < world for r in ranks) or dist.get_rank() not in ranks:
        raise ValueError(
            f"fully_shard: the mesh's ranks {ranks} must be ranks of the world "
            f"(0..{world - 1}) and include this rank ({dist.get_rank()})"
        )
    if device_mesh.ndim == 1:
        return device_mesh.get_group(0), None
    return device_mesh.get_group(1), device_mesh.get_group(0)

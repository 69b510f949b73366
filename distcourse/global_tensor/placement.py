"""Placement: which ranks hold a global tensor, as a 1-D or 2-D array (OneFlow's
`flow.placement`), with one process group per line of each mesh dimension.

`placement("cpu", ranks=[[0, 1], [2, 3]])`: mesh dimension 0 runs down the columns
(ranks 0 and 2 form a group), dimension 1 along the rows (0 and 1). Creating a
placement creates process groups, so every rank of the world creates the same
placements in the same order; equal placements (same ranks, same timeout) are
cached and built once. A
placement may also wrap a `distcourse.mesh.Mesh` or a torch DeviceMesh and reuse
their groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from distcourse import emulate
from distcourse.rendezvous import as_timedelta
from distcourse.runtime import DEFAULT_TIMEOUT, require_initialized

_CACHE: dict[tuple, Placement] = {}


class Placement:
    """A device type and an array of global ranks; equal if both are equal."""

    def __init__(
        self, device_type: str, grid: torch.Tensor, groups: list[Any], flat: Any
    ) -> None:
        self.device_type = device_type
        self.grid = grid  # int64, one entry per rank, row-major
        self.groups = groups  # this rank's group along each mesh dim (None: absent)
        self.flat = flat  # a group of all the placement's ranks
        where = (grid == dist.get_rank()).nonzero()
        self.coord = tuple(where[0].tolist()) if len(where) else None
        self.key = (device_type, tuple(grid.shape), tuple(grid.flatten().tolist()))
        self.hierarchy = tuple(grid.shape)  # size of each mesh dim (OneFlow's name)

    @property
    def ranks(self) -> list:
        """The ranks as given: a list (1-D) or a list of lists (2-D)."""
        return self.grid.tolist()

    @property
    def ndim(self) -> int:
        return self.grid.dim()

    @property
    def device(self) -> torch.device:
        """Where this rank's pieces live: cpu, or this rank's cuda (or emulated GPU)
        device, the current one of its device module."""
        if self.device_type == "cpu":
            return torch.device("cpu")
        module = torch.get_device_module(self.device_type)
        return torch.device(self.device_type, module.current_device())

    def require_member(self, what: str) -> tuple[int, ...]:
        """This rank's coordinate; ValueError if it holds no piece of `what`."""
        if self.coord is None:
            raise ValueError(
                f"{what}: rank {dist.get_rank()} is not in placement ranks "
                f"{self.ranks}; only its ranks may hold its tensors"
            )
        return self.coord

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Placement) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __deepcopy__(self, memo: dict) -> Placement:
        return self  # it names groups, which are shared: copy.deepcopy(model) works

    def __repr__(self) -> str:
        return f'placement(type="{self.device_type}", ranks={self.ranks})'


def placement(
    type: str = "cpu",  # noqa: A002 (OneFlow's keyword)
    ranks: Sequence | None = None,
    *,
    mesh: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> Placement:
    """A placement over `ranks` (a list, or a list of equal-length lists), or over a
    Mesh / DeviceMesh given as `mesh=`. Checked on every rank before any group is
    created: ranks must be distinct ranks of the world. Its groups wait `timeout`
    seconds for a collective (a group of the whole world in order is the world's
    own group, with the world's timeout)."""
    info = require_initialized()
    if mesh is not None:
        return _from_mesh(mesh)
    if type not in ("cpu", "cuda") and not (
        emulate.enabled() and type == emulate.DEVICE_TYPE
    ):
        raise ValueError(f'placement type must be "cpu" or "cuda", got {type!r}')
    grid = _grid(ranks, info.world_size)
    wait = as_timedelta(timeout)
    key = (type, tuple(grid.shape), tuple(grid.flatten().tolist()), wait)
    if key not in _CACHE:  # another timeout: other groups
        _CACHE[key] = _build(type, grid, wait)
    return _CACHE[key]


def _grid(ranks: Sequence | None, world: int) -> torch.Tensor:
    """ranks as an int64 tensor of 1 or 2 dims, checked."""
    if ranks is None:
        ranks = list(range(world))
    try:
        grid = torch.tensor(ranks, dtype=torch.int64)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"placement ranks must be a list of ints or of equal-length lists, got "
            f"{ranks!r} ({err})"
        ) from None
    if grid.dim() not in (1, 2) or grid.numel() == 0:
        raise ValueError(
            f"placement ranks must be a non-empty 1-D or 2-D array, got {ranks!r}"
        )
    flat = grid.flatten().tolist()
    bad = [r for r in flat if not 0 <= r < world]
    if bad:
        raise ValueError(
            f"placement ranks {bad} are not ranks of this world (ranks 0..{world - 1})"
        )
    if len(set(flat)) != len(flat):
        raise ValueError(f"placement ranks must be distinct, got {ranks!r}")
    for dim in range(grid.dim()):  # torch numbers a group's ranks in sorted order
        if any(line != sorted(line) for line in _lines(grid, dim)):
            raise ValueError(
                f"placement ranks must increase along every mesh "
                f"dimension, got {ranks!r}"
            )
    return grid


def _lines(grid: torch.Tensor, dim: int) -> list[list[int]]:
    """Every group along mesh dimension `dim`: ranks sharing all other coordinates."""
    moved = grid.movedim(dim, -1).reshape(-1, grid.shape[dim])
    return moved.tolist()


def _build(device_type: str, grid: torch.Tensor, timeout: Any) -> Placement:
    """Create the groups (every rank, same order) and keep this rank's."""
    me, world = dist.get_rank(), dist.get_world_size()
    groups = []
    for dim in range(grid.dim()):
        mine = None
        for line in _lines(grid, dim):
            group = _group(line, world, timeout)
            if me in line:
                mine = group
        groups.append(mine)
    flat = _group(grid.flatten().tolist(), world, timeout)
    return Placement(device_type, grid, groups, flat if me in grid else None)


def _group(ranks: list[int], world: int, timeout: Any) -> Any:
    """A process group of `ranks` (the default group if that is all of them)."""
    if sorted(ranks) == list(range(world)) and ranks == sorted(ranks):
        return dist.group.WORLD
    return dist.new_group(ranks, timeout=timeout)


def _from_mesh(mesh: Any) -> Placement:
    """A placement over a distcourse Mesh or a torch DeviceMesh, sharing its groups."""
    device_mesh = getattr(mesh, "device_mesh", mesh)
    if not hasattr(device_mesh, "get_group") or not hasattr(device_mesh, "mesh"):
        raise ValueError(
            f"mesh= must be a distcourse Mesh or a DeviceMesh, got "
            f"{type(mesh).__name__}"
        )
    grid = device_mesh.mesh.to(torch.int64).cpu()
    if grid.dim() > 2:
        raise ValueError(f"placements are 1-D or 2-D; this mesh is {grid.dim()}-D")
    groups = [device_mesh.get_group(d) for d in range(grid.dim())]
    flat = dist.group.WORLD
    if grid.numel() != dist.get_world_size():
        raise ValueError("mesh= must span the whole world; use ranks= for fewer")
    return Placement(device_mesh.device_type, grid, groups, flat)

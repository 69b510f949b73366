"""A named grid of ranks: which ranks talk to which along each parallel axis.

Hybrid parallelism arranges the world as a grid, e.g. 8 ranks as (dp=2, pp=2, tp=2).
Rank r sits at the row-major position of r in `torch.arange(world).view(*shape)`, so
the last axis is innermost: tp neighbours are adjacent ranks (on one host, where
bandwidth is highest), dp replicas are far apart. Along each axis, the ranks that
share all other coordinates form one process group: rank 5 = (1, 0, 1) does tp with
4 and 5, pp with 5 and 7, dp with 1 and 5.

`Mesh` is a thin, checked wrapper over PyTorch's `init_device_mesh`: torch owns the
groups; this class only names them and answers the questions a strategy asks (who
is my previous pipeline stage? which ranks hold my tensor-parallel shards?).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from distcourse.arguments import positive_int
from distcourse.rendezvous import as_timedelta
from distcourse.runtime import DEFAULT_TIMEOUT, require_initialized
from distcourse.torchcompat import set_group_timeout

MAX_LINE = 80  # describe() prints lines a book page can hold


class Mesh:
    """This rank's view of a named grid of ranks, with one process group per axis.

    `Mesh((2, 2), ("dp", "tp"))` on 4 ranks. A collective: every rank must build the
    same mesh, in the same order as its other groups. Arguments are checked before
    any group is created, so a bad mesh raises on every rank instead of hanging one.
    Each axis group fails a collective after `timeout` seconds (torch would give
    new groups 30 minutes, whatever the default group's timeout).
    """

    def __init__(
        self,
        shape: Sequence[int],
        names: Sequence[str],
        *,
        device_type: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._shape, self._names = check_layout(shape, names)
        limit = as_timedelta(timeout)
        info = require_initialized()
        if math.prod(self._shape) != info.world_size:
            raise ValueError(
                f"mesh {self._shape} {self._names} needs {math.prod(self._shape)} "
                f"ranks, but the world has {info.world_size}"
            )
        self._mesh = init_device_mesh(
            device_type or info.device.type, self._shape, mesh_dim_names=self._names
        )
        for name in self._names:  # an axis spanning the world may reuse the default
            group = self._mesh.get_group(name)  # group: leave its timeout alone
            if group is not dist.group.WORLD:
                set_group_timeout(group, limit)

    # ------------------------------------------------------------ the grid ------

    @property
    def device_mesh(self) -> DeviceMesh:
        """The underlying torch DeviceMesh (for DTensor and torch's own APIs)."""
        return self._mesh

    @property
    def shape(self) -> tuple[int, ...]:
        """Degree of each axis, e.g. (2, 2)."""
        return self._shape

    @property
    def names(self) -> tuple[str, ...]:
        """Name of each axis, outermost first, e.g. ("dp", "tp")."""
        return self._names

    @property
    def rank(self) -> int:
        """This rank's global rank."""
        return dist.get_rank()

    def grid(self) -> torch.Tensor:
        """The full grid: entry [i, j, ...] is the global rank at that coordinate."""
        return self._mesh.mesh.clone()

    @property
    def coordinate(self) -> dict[str, int]:
        """This rank's position in the grid, by axis name, e.g. {"dp": 1, "tp": 0}."""
        coords = self._mesh.get_coordinate()
        assert coords is not None  # every rank of the world is in the mesh
        return dict(zip(self._names, coords, strict=True))

    # ------------------------------------------------------- one axis ------

    def size(self, axis: str) -> int:
        """Degree of `axis`: how many ranks are in each of its groups."""
        return self._shape[self._index(axis)]

    def group(self, axis: str) -> dist.ProcessGroup:
        """This rank's process group along `axis`: pass it to any collective."""
        self._index(axis)
        return self._mesh.get_group(axis)

    def ranks(self, axis: str) -> list[int]:
        """Global ranks of this rank's group along `axis`, in group-rank order."""
        return dist.get_process_group_ranks(self.group(axis))

    def local_rank(self, axis: str) -> int:
        """This rank's index within its group along `axis` (its coordinate there)."""
        self._index(axis)
        return self._mesh.get_local_rank(axis)

    def neighbours(
        self, axis: str, *, wrap: bool = False
    ) -> tuple[int | None, int | None]:
        """(previous, next) global ranks along `axis`.

        Without `wrap` (a pipeline), the first rank has no previous and the last no
        next: None. With `wrap` (a ring), the ends join up.
        """
        ranks, i = self.ranks(axis), self.local_rank(axis)
        n = len(ranks)
        if wrap:
            return ranks[(i - 1) % n], ranks[(i + 1) % n]
        return (ranks[i - 1] if i > 0 else None), (ranks[i + 1] if i < n - 1 else None)

    def __getitem__(self, axis: str) -> DeviceMesh:
        """The 1-D sub DeviceMesh along `axis` (for DTensor); reuses its group.

        The first slice in a process imports torch._dynamo: a few seconds, once.
        """
        self._index(axis)
        return self._mesh[axis]

    # ------------------------------------------------------------ printing ------

    def describe(self) -> str:
        """A few short lines: the grid, this rank's place, each axis's group."""
        coord = " ".join(f"{n}={c}" for n, c in self.coordinate.items())
        lines = [
            f"mesh {self._shape} {self._names}: {math.prod(self._shape)} ranks",
            f"rank {self.rank} at {coord}",
        ]
        for name in self._names:
            head = f"  {name}: size {self.size(name)}, I am {self.local_rank(name)}, "
            lines.append(head + _short(self.ranks(name), MAX_LINE - len(head) - 6))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Mesh({self._shape}, {self._names})"

    def _index(self, axis: str) -> int:
        """Position of `axis` in names; ValueError naming the valid ones."""
        if axis not in self._names:
            raise ValueError(f"unknown axis {axis!r}; this mesh has {self._names}")
        return self._names.index(axis)


def check_layout(
    shape: Sequence[int], names: Sequence[str]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Check a mesh's shape and names without touching any group; return tuples.

    Degrees are positive ints, names unique non-empty strings, one per degree.
    """
    if isinstance(shape, int) or isinstance(names, str):
        raise ValueError(
            f"shape and names must be sequences, e.g. (2,) and ('dp',); "
            f"got {shape!r} and {names!r}"
        )
    shape, names = tuple(shape), tuple(names)
    if not shape:
        raise ValueError("a mesh needs at least one axis")
    for d in shape:
        positive_int(d, f"each of the degrees {shape}")
    if len(names) != len(shape):
        raise ValueError(
            f"{len(shape)} degrees {shape} but {len(names)} names {names}: "
            "give one name per axis"
        )
    for n in names:
        if not isinstance(n, str) or not n:
            raise ValueError(f"axis names must be non-empty strings, got {names}")
    if len(set(names)) != len(names):
        raise ValueError(f"axis names must be unique, got {names}")
    return shape, names


def _short(ranks: list[int], width: int) -> str:
    """`ranks [0, 1, 2]`, elided in the middle if longer than `width` characters."""
    text = str(ranks)
    if len(text) > width and len(ranks) > 4:
        text = f"[{ranks[0]}, {ranks[1]}, ..., {ranks[-2]}, {ranks[-1]}]"
    return f"ranks {text}"

"""distcourse.mesh on real gloo ranks: every axis group checked against a hand grid.

The hand grid is `torch.arange(world).view(*shape)`; along an axis, a rank's group is
the ranks that share all its other coordinates. One spawn per world size runs every
check and sends the results home, where they are compared (8 ranks on 2 cores is
slow to start, so each spawn does as much as it can). The slow or disruptive checks
run on 4 ranks only: slicing a DeviceMesh first imports torch._dynamo (seconds per
rank, so only ranks 0 and 3 slice: between them they sit in all four 2x2 groups),
and the timeout probe leaves a broken group behind.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from distcourse.launch import spawn
from distcourse.mesh import Mesh

SLICERS = (0, 3)  # opposite corners of the 2x2 grid
CASES = [((2,), ("dp",)), ((2, 2), ("dp", "tp")), ((2, 2, 2), ("dp", "pp", "tp"))]


def _hand_group(shape: tuple[int, ...], rank: int, axis: int) -> list[int]:
    """Ranks sharing all of `rank`'s coordinates except the one on `axis`."""
    grid = torch.arange(math.prod(shape)).view(shape)
    coord = torch.unravel_index(torch.tensor(rank), shape)
    index = tuple(slice(None) if i == axis else int(c) for i, c in enumerate(coord))
    return grid[index].tolist()


def _observe(shape: tuple[int, ...], names: tuple[str, ...], extras: bool) -> dict:
    """On each rank: build the mesh, run a collective per axis, report what it saw."""
    mesh = Mesh(shape, names, timeout=20)
    seen: dict[str, Any] = {"grid": mesh.grid().tolist()}
    seen["torch_grid"] = mesh.device_mesh.mesh.tolist()
    seen["coordinate"] = mesh.coordinate
    seen["describe"] = mesh.describe()
    for name in names:
        total = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(total, group=mesh.group(name))  # a real group, or this fails
        seen[name] = dict(
            size=mesh.size(name),
            ranks=mesh.ranks(name),
            local_rank=mesh.local_rank(name),
            sum=total.item(),
            line=mesh.neighbours(name),
            ring=mesh.neighbours(name, wrap=True),
        )
        if extras and dist.get_rank() in SLICERS:
            seen[name]["sub"] = mesh[name].mesh.tolist()
    with pytest.raises(ValueError, match="unknown axis 'xx'") as err:
        mesh.group("xx")
    seen["unknown"] = str(err.value)
    if extras:
        seen["probe_s"] = _lonely_all_reduce()
    return seen


def _lonely_all_reduce() -> float:
    """Only tp coordinate 0 joins an all_reduce over tp: it must fail, not wait 30 min.

    Its partner waits at a world barrier meanwhile (alive, so no connection error).
    """
    mesh = Mesh((2, 2), ("dp", "tp"), timeout=1)
    elapsed = 0.0
    if mesh.coordinate["tp"] == 0:
        start = time.perf_counter()
        with pytest.raises(RuntimeError):
            dist.all_reduce(torch.ones(1), group=mesh.group("tp"))
        elapsed = time.perf_counter() - start
    dist.barrier()
    return elapsed


@pytest.mark.parametrize(("shape", "names"), CASES, ids=["1d", "2x2", "2x2x2"])
def test_axis_groups_match_the_hand_grid(shape: tuple, names: tuple) -> None:
    world = math.prod(shape)
    seen = spawn(_observe, world, shape, names, world == 4, timeout=20)
    grid = torch.arange(world).view(shape)
    for rank, got in enumerate(seen):
        assert got["grid"] == got["torch_grid"] == grid.tolist()  # row-major
        coord = [int(c) for c in torch.unravel_index(torch.tensor(rank), shape)]
        assert got["coordinate"] == dict(zip(names, coord, strict=True))
        for axis, name in enumerate(names):
            group = _hand_group(shape, rank, axis)
            i = coord[axis]
            prev = group[i - 1] if i > 0 else None
            nxt = group[i + 1] if i < len(group) - 1 else None
            want = dict(
                size=shape[axis],
                ranks=group,
                local_rank=i,
                sum=float(sum(group)),
                line=(prev, nxt),
                ring=(group[(i - 1) % len(group)], group[(i + 1) % len(group)]),
            )
            if world == 4 and rank in SLICERS:
                want["sub"] = group
            assert got[name] == want
            line = f"  {name}: size {shape[axis]}, I am {i}, ranks {group}"
            assert line in got["describe"].splitlines()
        assert f"rank {rank} at " in got["describe"]
        assert all(len(line) <= 80 for line in got["describe"].splitlines())
        assert got["unknown"] == f"unknown axis 'xx'; this mesh has {names}"
        if world == 4 and coord[-1] == 0:
            assert 0.5 < got["probe_s"] < 10, "axis groups must carry the timeout"


def _world_mismatch() -> str:
    """Rank 0 alone tries a 4-rank mesh: had it created a group, it would hang."""
    message = ""
    if dist.get_rank() == 0:
        with pytest.raises(ValueError) as err:
            Mesh((2, 2), ("dp", "tp"))
        message = str(err.value)
    dist.barrier()
    return message


def test_wrong_world_size_raises_before_any_group() -> None:
    messages = spawn(_world_mismatch, 2, timeout=5, deadline=20)
    assert messages[0] == "mesh (2, 2) ('dp', 'tp') needs 4 ranks, but the world has 2"


@pytest.mark.parametrize(
    ("shape", "names", "match"),
    [
        ((2, 2), ("dp", "dp"), "unique"),
        ((2, 2), ("dp",), "one name per axis"),
        ((2,), ("dp", "tp"), "one name per axis"),
        ((2, 0), ("dp", "tp"), "must be a positive integer"),
        ((2, True), ("dp", "tp"), "must be a positive integer"),
        ((2.0,), ("dp",), "must be a positive integer"),
        ((2,), ("",), "non-empty strings"),
        ((2,), (3,), "non-empty strings"),
        ((), (), "at least one axis"),
        (2, ("dp",), "sequences"),
        ((2,), "dp", "sequences"),
    ],
)
def test_bad_layouts_raise_before_needing_a_group(
    shape: Any, names: Any, match: str
) -> None:
    assert not dist.is_initialized()  # checked here, in the test process: no ranks
    with pytest.raises(ValueError, match=match):
        Mesh(shape, names)


def test_a_good_layout_without_a_group_says_what_to_do() -> None:
    with pytest.raises(RuntimeError, match="no process group"):
        Mesh((2,), ("dp",))

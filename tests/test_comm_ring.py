"""distcourse.comm on real gloo ranks: each hand-written collective equals torch's."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distcourse import comm
from distcourse.comm import ring
from distcourse.launch import spawn
from distcourse.runtime import RankError

DTYPES = [torch.float32, torch.float64, torch.int64]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
# newer torch renames reduce_scatter_tensor; use whichever this torch has
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None)
_reduce_scatter_single = _reduce_scatter_single or dist.reduce_scatter_tensor


def _data(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    # small integers: every reduction is exact in every dtype, so results compare equal
    gen = torch.Generator().manual_seed(1000 * rank + numel)
    return torch.randint(1, 4, (numel,), generator=gen).to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and torch.equal(got, want), f"{what}: {got} {want}"


def _against_torch(numel: int, dtype: torch.dtype, ops: list) -> None:
    """Every comm collective on one size and dtype, against the torch collective."""
    n, rank = dist.get_world_size(), dist.get_rank()
    x = _data(rank, numel, dtype)
    for op in ops:
        want = x.clone()
        dist.all_reduce(want, op=op)
        _same(comm.ring_all_reduce(x.clone(), op=op), want, f"ring {op} {numel}")
        _same(comm.naive_all_reduce(x.clone(), op=op), want, f"naive {op} {numel}")
    for src in sorted({0, n - 1}):
        want = x.clone()
        dist.broadcast(want, src)
        _same(comm.tree_broadcast(x.clone(), src), want, f"broadcast from {src}")
    want = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(want, x)
    got = [torch.empty_like(x) for _ in range(n)]
    comm.ring_all_gather(got, x)
    for r in range(n):
        _same(got[r], want[r], f"all_gather block {r}")
    _same(comm.ring_all_gather(x.new_empty(n * numel), x), torch.cat(want), "into")
    blocks = [_data(rank + 10 * r, numel, dtype) for r in range(n)]  # block r -> rank r
    want = torch.empty_like(x)
    dist.reduce_scatter(want, [b.clone() for b in blocks])
    _same(comm.ring_reduce_scatter(torch.empty_like(x), blocks), want, "rs list")
    flat = torch.cat(blocks)
    _reduce_scatter_single(want, flat.clone())
    _same(comm.ring_reduce_scatter(torch.empty_like(x), flat), want, "rs tensor")
    _same(flat, torch.cat(blocks), "reduce_scatter left its input alone")


def _all_collectives() -> None:
    n, rank = dist.get_world_size(), dist.get_rank()
    for dtype in DTYPES:
        ops = OPS if dtype == torch.float32 else OPS[:1]
        for numel in (1, 2 * n + 1, 16):  # fewer than N, not divisible by N, even
            _against_torch(numel, dtype, ops)
    # chunks in many pieces (the pipelined path), then in more pieces than elements
    # (empty pieces), then every chunk in at least two, however small
    for piece, split in ((16, ring.SPLIT_BYTES), (1, ring.SPLIT_BYTES), (1 << 20, 0)):
        saved = ring.PIECE_BYTES, ring.SPLIT_BYTES
        ring.PIECE_BYTES, ring.SPLIT_BYTES = piece, split
        try:
            _against_torch(5 * n + 3, torch.float64, OPS[:2])
        finally:
            ring.PIECE_BYTES, ring.SPLIT_BYTES = saved
    # any shape, contiguous or not: work on a flat copy, then copy back
    x = torch.arange(12.0).view(3, 4).t() * (rank + 1)  # (4, 3), not contiguous
    want = x.contiguous()
    dist.all_reduce(want)
    _same(comm.ring_all_reduce(x), want, "non-contiguous all-reduce")
    cube = torch.full((2, 2, 2), rank)  # (2, 2, 2) int64
    _same(comm.tree_broadcast(cube, 0), torch.zeros_like(cube), "3-d broadcast")
    # empty tensors: nothing to move, but every rank must return
    empty = torch.empty(0)
    assert comm.ring_all_reduce(empty.clone()).shape == (0,)
    assert comm.naive_all_reduce(empty.clone()).shape == (0,)
    assert comm.tree_broadcast(empty.clone(), 0).shape == (0,)
    assert comm.ring_all_gather(torch.empty(0), empty).shape == (0,)
    assert comm.ring_reduce_scatter(empty.clone(), torch.empty(0)).shape == (0,)


@pytest.mark.parametrize("world_size", range(1, 9))
def test_every_collective_equals_torch(world_size: int) -> None:
    spawn(_all_collectives, world_size, timeout=60)


def _on_a_subgroup() -> list[str]:
    """Collectives on group [1, 3] of 4 ranks; ranks 0 and 2 are not members."""
    rank = dist.get_rank()
    group = dist.new_group([1, 3])
    x = _data(rank, 5, torch.float32)
    if rank in (1, 3):
        want = x.clone()
        dist.all_reduce(want, group=group)
        _same(comm.ring_all_reduce(x.clone(), group=group), want, "group all-reduce")
        want = x.clone()
        dist.broadcast(want, src=3, group=group)  # src=1 is group rank 1, global 3
        _same(comm.tree_broadcast(x.clone(), 1, group=group), want, "group broadcast")
        return []
    try:
        comm.ring_all_reduce(x, group=group)
    except ValueError as err:
        return [str(err)]
    return ["no error"]


def test_collectives_work_on_a_subgroup_and_refuse_outsiders() -> None:
    results = spawn(_on_a_subgroup, 4)
    assert results[1] == results[3] == []
    for rank in (0, 2):
        assert f"rank {rank} is not a member of the group" in results[rank][0]


def _mismatched_shapes() -> None:
    comm.ring_all_reduce(torch.zeros(3 + dist.get_rank()))


def test_mismatched_shapes_fail_with_value_error() -> None:
    with pytest.raises(RankError, match=r"ValueError: .*float32\[3\].*float32\[4\]"):
        spawn(_mismatched_shapes, 2)


def _errors(call) -> str:
    try:
        call()
    except ValueError as err:
        return str(err)
    return "no error"


def _bad_calls() -> dict[str, str]:
    """Each bad call on every rank of 3; each must raise on every rank, then go on."""
    rank = dist.get_rank()
    x = torch.ones(4)
    bad = {
        "shape": lambda: comm.ring_all_reduce(torch.ones(4 + (rank == 1))),
        "dtype": lambda: comm.ring_all_reduce(x.double() if rank == 2 else x),
        "op mismatch": lambda: comm.ring_all_reduce(x, op="max" if rank else "sum"),
        "src": lambda: comm.tree_broadcast(x, src=3),
        "src on one rank": lambda: comm.tree_broadcast(x, src=5 if rank == 0 else 0),
        "unknown op": lambda: comm.ring_all_reduce(x, op=dist.ReduceOp.AVG),
        "outputs": lambda: comm.ring_all_gather([torch.empty(4)] * 2, x),
        "unchecked src": lambda: comm.tree_broadcast(x, src=-1, check=False),
    }
    messages = {name: _errors(call) for name, call in bad.items()}
    # the group is still in step: a good call still works after all those errors
    assert comm.ring_all_reduce(torch.ones(2)).tolist() == [3.0, 3.0]
    return messages


def test_bad_calls_raise_value_error_on_every_rank() -> None:
    by_rank = spawn(_bad_calls, 3)
    for rank, got in enumerate(by_rank):
        assert "no error" not in got.values(), (rank, got)
        assert "float32[5]" in got["shape"] and "float32[4]" in got["shape"]
        assert "float64[4]" in got["dtype"]
        assert "op=MAX" in got["op mismatch"] and "op=SUM" in got["op mismatch"]
        assert "src=3 is out of range: valid ranks are 0..2" in got["src"]
        assert "unsupported reduce op" in got["unknown op"]
        assert "output must be 3 tensor(s)" in got["outputs"]
        assert "src=-1" in got["unchecked src"]
    assert "src=5 is out of range" in by_rank[0]["src on one rank"]
    for rank in (1, 2):  # they were fine, but learn that rank 0 was not
        assert (
            "rank(s) [0] rejected their arguments" in by_rank[rank]["src on one rank"]
        )


def test_without_a_process_group_the_error_says_what_to_do() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="no process group"):
        comm.ring_all_reduce(torch.ones(3))

"""distcourse.comm.tree on real gloo ranks: equal to torch's; bytes as the formula."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distcourse import comm
from distcourse.comm import costmodel
from distcourse.launch import spawn
from distcourse.runtime import RankError


def _data(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    # small integers: sums are exact in every dtype, whatever the order of additions
    gen = torch.Generator().manual_seed(100 * rank + numel)
    return torch.randint(1, 5, (numel,), generator=gen).to(dtype)


def _against_torch() -> None:
    rank = dist.get_rank()
    for dtype in (torch.float32, torch.int64):
        for numel in (1, 7, 1000):
            x = _data(rank, numel, dtype)
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                want = x.clone()
                dist.all_reduce(want, op=op)
                got = comm.tree_all_reduce(x.clone(), op=op)
                assert torch.equal(got, want), (dtype, numel, op, got, want)
                root = comm.tree_reduce(x.clone(), op=op)
                if rank == 0:
                    assert torch.equal(root, want), ("reduce", dtype, numel, op)
    y = torch.arange(12.0).view(3, 4).t() * (rank + 1)  # (4, 3), not contiguous
    want = y.contiguous()
    dist.all_reduce(want)
    assert torch.equal(comm.tree_all_reduce(y), want)
    assert comm.tree_all_reduce(torch.empty(0)).shape == (0,)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_tree_all_reduce_equals_torch(world_size: int) -> None:
    spawn(_against_torch, world_size, timeout=60)


def _count(nbytes: int) -> tuple[int, int]:
    with comm.Ledger() as ledger:
        comm.tree_all_reduce(torch.ones(nbytes // 4), check=False)
    return ledger.bytes_sent(), ledger.bytes_received()


@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_ledger_bytes_equal_the_formula(world_size: int) -> None:
    nbytes = 4096
    counted = spawn(_count, world_size, nbytes)
    formula = costmodel.sent_per_rank("tree_all_reduce", nbytes, world_size)
    assert [sent for sent, _ in counted] == formula
    assert sum(received for _, received in counted) == sum(formula)  # every byte lands
    busiest = costmodel.predict("tree_all_reduce", nbytes, world_size).bytes_sent
    assert max(formula) == busiest


def _mismatched_ops() -> None:
    comm.tree_all_reduce(torch.ones(3), op="max" if dist.get_rank() else "sum")


def test_mismatched_calls_fail_on_every_rank() -> None:
    with pytest.raises(RankError, match=r"ValueError: .*op=(MAX|SUM)"):
        spawn(_mismatched_ops, 3)


def _on_a_subgroup() -> bool:
    """Ranks 1, 2, 3 of 4 form a group (its root is global rank 1); rank 0 stays out."""
    rank = dist.get_rank()
    group = dist.new_group([1, 2, 3])
    if rank == 0:
        return True
    x = _data(rank, 9, torch.float32)
    want = x.clone()
    dist.all_reduce(want, group=group)
    return torch.equal(comm.tree_all_reduce(x, group=group), want)


def test_tree_all_reduce_works_on_a_subgroup() -> None:
    assert all(spawn(_on_a_subgroup, 4))

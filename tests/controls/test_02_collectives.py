"""Negative controls of chapter 2: each verdict it prints, shown failing on a fault.

The chapter compares its collectives with torch's (`torch.equal`, whole numbers so
every sum is exact) and the bytes a Ledger counts with the formulas of
`costmodel.sent_per_rank`. Here the same comparisons run on 4 ranks, as in the
chapter, once as written and once with an off-by-one planted, in one spawn.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

from distcourse import comm
from distcourse.comm.costmodel import sent_per_rank
from distcourse.comm.ledger import Ledger
from distcourse.launch import spawn

WORLD = 4  # the chapter's ranks
S = 2**20  # the bytes of the chapter's ledger cell: 1 MiB of float32
ALL_REDUCES = ("ring_all_reduce", "naive_all_reduce", "tree_all_reduce")


def _shift(outgoing: torch.Tensor, incoming: torch.Tensor) -> None:
    """The chapter's shift: send to the right, receive from the left."""
    rank, n = dist.get_rank(), dist.get_world_size()
    works = [
        dist.isend(outgoing, dst=(rank + 1) % n),
        dist.irecv(incoming, src=(rank - 1) % n),
    ]
    for work in works:
        work.wait()


def _cell_ring(x: torch.Tensor, chunk_off_by_one: bool) -> torch.Tensor:
    """The chapter's ring all-reduce; the fault adds each incoming chunk into the
    chunk this rank just sent (rank - step) instead of the next (rank - step - 1)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(n)
    incoming = torch.empty_like(chunks[0])
    for step in range(n - 1):  # reduce-scatter
        mine, theirs = (rank - step) % n, (rank - step - 1) % n
        theirs = mine if chunk_off_by_one else theirs
        _shift(chunks[mine], incoming)
        chunks[theirs].add_(incoming)
    for step in range(n - 1):  # all-gather
        mine, theirs = (rank - step + 1) % n, (rank - step) % n
        _shift(chunks[mine], chunks[theirs])
    return x


def _numbers(rank: int) -> torch.Tensor:
    """The chapter's input: 1000 whole numbers 0..9, seeded by the rank."""
    gen = torch.Generator().manual_seed(rank)
    return torch.randint(0, 10, (1000,), generator=gen).float()


def _collectives(fault: bool) -> dict[str, bool]:
    """The chapter's `check` of each package collective against torch's.

    Faults: the all-reduces run on a group of the first N-1 ranks (the last rank
    left out); the broadcast from rank 1, not 2; the all-gather handed the left
    neighbour's tensor and the reduce-scatter its input rolled by one block (each
    block one rank off).
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    x = _numbers(rank)
    fewer = dist.new_group(list(range(n - 1)))  # every rank takes part in making it
    found = {}

    def check(name: str, ours: torch.Tensor, collective: Callable, out, *args, **kw):
        collective(out, *args, **kw)
        found[name] = torch.equal(ours, out)

    for name in ALL_REDUCES:
        for op in ("SUM", "MAX"):
            reduce_op = getattr(dist.ReduceOp, op)
            if not fault:
                ours = getattr(comm, name)(x.clone(), op=reduce_op)
            elif rank < n - 1:
                ours = getattr(comm, name)(x.clone(), op=reduce_op, group=fewer)
            else:  # the rank left out keeps its own numbers
                ours = x.clone()
            check(f"{name} {op}", ours, dist.all_reduce, x.clone(), op=reduce_op)
    check(
        "tree_broadcast",
        comm.tree_broadcast(x.clone(), src=1 if fault else 2),
        dist.broadcast,
        x.clone(),
        src=2,
    )
    handed = _numbers((rank - 1) % n) if fault else x
    gathered = comm.ring_all_gather(x.new_empty(n * 1000), handed)
    check(
        "ring_all_gather",
        gathered,
        dist.all_gather_into_tensor,
        x.new_empty(n * 1000),
        x,
    )
    handed = x.roll(-(1000 // n)) if fault else x
    scattered = comm.ring_reduce_scatter(x.new_empty(1000 // n), handed)
    check(
        "ring_reduce_scatter",
        scattered,
        dist.reduce_scatter_tensor,
        x.new_empty(1000 // n),
        x,
    )
    return found


def _sent(check: bool) -> dict[str, int]:
    """The chapter's ledger cell: the bytes this rank sends in each all-reduce of S
    bytes (`check=True` adds the 112-byte agreement, which the chapter leaves out)."""
    sent = {}
    for name in ALL_REDUCES:
        with Ledger() as ledger:
            getattr(comm, name)(torch.ones(S // 4), check=check)
        sent[name] = ledger.bytes_sent()
    return sent


def _on_each_rank() -> dict[str, object]:
    x = torch.arange(4.0) + 10 * dist.get_rank()  # the chapter's start()
    reference = x.clone()
    dist.all_reduce(reference)
    return {
        "cell ring": torch.equal(_cell_ring(x.clone(), False), reference),
        "cell ring off by one": torch.equal(_cell_ring(x.clone(), True), reference),
        "collectives": _collectives(fault=False),
        "collectives off by one": _collectives(fault=True),
        "sent": _sent(check=False),
        "sent with the check": _sent(check=True),
    }


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, object]]:
    return spawn(_on_each_rank, WORLD)


def formula_verdict(
    counted: list[dict[str, int]], formula: dict[str, list[int]]
) -> str:
    """The chapter's last line: PASS if every rank sent what its formula says."""
    same = all(
        row[k] == formula[k][r] for r, row in enumerate(counted) for k in formula
    )
    return "PASS" if same else "FAIL"


def test_as_written_every_check_passes(ranks: list[dict]) -> None:
    assert all(r["cell ring"] for r in ranks)
    assert all(all(r["collectives"].values()) for r in ranks)
    formula = {name: sent_per_rank(name, S, WORLD) for name in ALL_REDUCES}
    assert formula_verdict([r["sent"] for r in ranks], formula) == "PASS"


@pytest.mark.controls(
    "02_collectives",
    r"equal to dist\.all_reduce: True",
    fault="the cell's ring with a chunk off by one: each incoming chunk added into "
    "the chunk just sent",
)
def test_a_ring_with_a_chunk_off_by_one_is_not_torchs(ranks: list[dict]) -> None:
    assert not any(r["cell ring off by one"] for r in ranks)


@pytest.mark.controls(
    "02_collectives",
    r"(ring|naive|tree)_all_reduce (SUM|MAX)\s+equals torch's: True",
    fault="the last rank left out of the all-reduce (run on a group of ranks 0-2)",
)
@pytest.mark.controls(
    "02_collectives",
    r"tree_broadcast\s+equals torch's: True",
    fault="broadcast from rank 1, one off the root torch's broadcast uses",
)
@pytest.mark.controls(
    "02_collectives",
    r"ring_all_gather\s+equals torch's: True",
    fault="each rank hands in its left neighbour's tensor: every block one slot off",
)
@pytest.mark.controls(
    "02_collectives",
    r"ring_reduce_scatter\s+equals torch's: True",
    fault="input rolled by one block: each rank left with its neighbour's block",
)
def test_collectives_one_rank_off_are_not_torchs(ranks: list[dict]) -> None:
    names = ranks[0]["collectives off by one"].keys()
    assert len(names) == 9
    for name in names:  # false on at least one rank, so the line is not all True
        assert not all(r["collectives off by one"][name] for r in ranks), name


@pytest.mark.controls(
    "02_collectives",
    r"every rank sent exactly what its formula says: PASS",
    fault="the bytes counted with the 112-byte agreement check left on (check=True)",
)
@pytest.mark.controls(
    "02_collectives",
    r"every rank sent exactly what its formula says: PASS",
    fault="a formula that counts what a rank hands in (S bytes each), not what it "
    "sends",
)
def test_bytes_off_the_formula_fail(ranks: list[dict]) -> None:
    formula = {name: sent_per_rank(name, S, WORLD) for name in ALL_REDUCES}
    checked = [r["sent with the check"] for r in ranks]
    assert formula_verdict(checked, formula) == "FAIL"
    handed_in = {name: [S] * WORLD for name in ALL_REDUCES}
    assert formula_verdict([r["sent"] for r in ranks], handed_in) == "FAIL"

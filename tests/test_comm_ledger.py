"""distcourse.ledger: bytes each rank sends, counted, and equal to the cost model."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distcourse import comm
from distcourse.comm import costmodel, ring
from distcourse.comm.ledger import Ledger, Record, all_to_all_wire, ring_wire_bytes
from distcourse.launch import spawn
from distcourse.torchcompat import GLOO_ALL_TO_ALL


def _p2p_bytes(call) -> tuple[int, int]:
    """Bytes this rank sends and receives point-to-point during `call()`."""
    with Ledger() as ledger:
        call()
    return ledger.bytes_sent(), ledger.bytes_received()


def _ring_bytes(numel: int, piece: int = 0) -> list[tuple]:
    """Per group size N (2, 3, 4): (N, bytes sent, bytes received) by a ring all-reduce
    of `numel` float32 on this rank, with check=False so only the ring is counted.
    `piece`: the ring's pieces of that many bytes (0: its default)."""
    if piece:
        ring.PIECE_BYTES = piece  # a spawned rank: the change dies with it
    rank, out = dist.get_rank(), []
    for n in (2, 3, 4):
        group = dist.new_group(list(range(n)))  # every rank must create every group
        if rank < n:
            x = torch.ones(numel)
            sent, got = _p2p_bytes(
                lambda x=x, g=group: comm.ring_all_reduce(x, group=g, check=False)
            )
            out.append((n, sent, got))
    return out


def _uneven_ring_bytes(numel: int, n: int, rank: int) -> int:
    """Exact bytes a ring all-reduce sends from `rank`: the sizes of its N-1 + N-1
    chunks, the first numel % N chunks one element longer."""
    sizes = [len(c) for c in torch.tensor_split(torch.empty(numel), n)]
    reduce_scatter = [sizes[(rank - s - 1) % n] for s in range(n - 1)]
    all_gather = [sizes[(rank - s) % n] for s in range(n - 1)]
    return 4 * (sum(reduce_scatter) + sum(all_gather))


@pytest.mark.parametrize("numel", [1200, 1201])  # divisible by 2, 3, 4 / by none
@pytest.mark.parametrize("piece", [0, 64])  # whole chunks / chunks in many pieces
def test_ring_all_reduce_sends_what_the_cost_model_says(numel: int, piece: int) -> None:
    results = spawn(_ring_bytes, 4, numel, piece)
    for rank, per_n in enumerate(results):
        for n, sent, got in per_n:
            predicted = costmodel.predict("ring_all_reduce", 4 * numel, n).bytes_sent
            if numel % n == 0:
                assert sent == got == predicted == 2 * (n - 1) * 4 * numel // n
            assert sent == _uneven_ring_bytes(numel, n, rank)
    for n in (2, 3, 4):  # every byte one rank sends, another receives
        rows = [row for per_n in results for row in per_n if row[0] == n]
        assert sum(row[1] for row in rows) == sum(row[2] for row in rows)


def _other_collectives() -> dict[str, int]:
    n = dist.get_world_size()
    x = torch.ones(8 * n)  # S = 32 * n bytes
    sent = {}
    sent["gather"], _ = _p2p_bytes(
        lambda: comm.ring_all_gather(torch.empty(8 * n), x[:8], check=False)
    )
    sent["scatter"], _ = _p2p_bytes(
        lambda: comm.ring_reduce_scatter(torch.empty(8), x, check=False)
    )
    sent["tree"], _ = _p2p_bytes(lambda: comm.tree_broadcast(x, 0, check=False))
    sent["naive"], _ = _p2p_bytes(lambda: comm.naive_all_reduce(x, check=False))
    return sent


def test_gather_scatter_tree_and_naive_bytes_match_the_model() -> None:
    n, size = 4, 32 * 4
    results = spawn(_other_collectives, n)
    for name, model in [
        ("gather", "ring_all_gather"),
        ("scatter", "ring_reduce_scatter"),
    ]:
        assert {r[name] for r in results} == {
            costmodel.predict(model, size, n).bytes_sent
        }
    # the busiest rank is the root: it is the one the model prices
    assert results[0]["tree"] == costmodel.predict("tree_broadcast", size, n).bytes_sent
    assert (
        results[0]["naive"] == costmodel.predict("naive_all_reduce", size, n).bytes_sent
    )
    assert [r["naive"] for r in results[1:]] == [size] * (n - 1)


def _torch_calls() -> tuple[list[Record], str, list[int]]:
    rank = dist.get_rank()
    alone = [dist.new_group([r]) for r in range(2)]  # every rank makes both
    with Ledger() as ledger:
        dist.all_reduce(torch.ones(4))
        dist.broadcast(torch.ones(2, dtype=torch.float64), src=1)
        ops = [
            dist.P2POp(dist.isend, torch.ones(3), (rank + 1) % 2),
            dist.P2POp(dist.irecv, torch.empty(3), (rank + 1) % 2),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        comm.ring_all_reduce(torch.ones(6))  # check=True: one small all_gather
        dist.all_reduce(torch.ones(1), group=alone[rank])  # a group of one rank
    sent = [ledger.bytes_sent(op) for op in ("all_reduce", "broadcast", "all_gather")]
    return ledger.records, ledger.summary(), sent


def test_ledger_records_torch_calls_and_the_check() -> None:
    for rank, (records, summary, sent) in enumerate(spawn(_torch_calls, 2)):
        peer = 1 - rank
        # a ring all_reduce of 16 bytes on 2 ranks: 2(n-1)/n x 16 on the wire
        assert records[0] == Record("all_reduce", "collective", 16, None, 2, (0, 1), 16)
        assert records[1].op == "broadcast" and records[1].bytes == 16 * rank
        assert records[1].wire == 16 * rank  # the root (rank 1) sends, the last not
        assert records[2:4] == [
            Record("batch_isend_irecv", "send", 12, peer, 2, (0, 1), 12),
            Record("batch_isend_irecv", "recv", 12, peer, 2, (0, 1), 0),
        ]
        assert records[4].op == "all_gather" and sent[2] == records[4].bytes > 0
        assert records[-1].ranks == (rank,) and records[-1].group_size == 1
        ring = [(r.op, r.kind) for r in records[5:-1]]  # reduce-scatter, all-gather
        assert (
            ring == [("batch_isend_irecv", "send"), ("batch_isend_irecv", "recv")] * 2
        )
        assert sent[:2] == [16, 16 * rank]  # a group of one sends nothing
        lines = [line.split() for line in summary.splitlines()]
        assert ["batch_isend_irecv", "send", "3", "36"] in lines  # 1 by hand, 2 ring
        assert lines[-2][:2] == ["total", "sent"]


def test_ledger_restores_torch_on_exit_and_on_error() -> None:
    original = dist.all_reduce, dist.isend, dist.P2POp, dist.batch_isend_irecv
    with Ledger():
        assert dist.all_reduce is not original[0]
    assert (dist.all_reduce, dist.isend, dist.P2POp, dist.batch_isend_irecv) == original
    with pytest.raises(KeyError), Ledger():
        raise KeyError("boom")
    assert (dist.all_reduce, dist.isend, dist.P2POp, dist.batch_isend_irecv) == original


def _dtensor_traffic() -> tuple[list[Record], int]:
    """A DTensor redistribute under both a Ledger and torch's CommDebugMode."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x = distribute_tensor(torch.arange(24.0).reshape(6, 4), mesh, [Shard(0)])
    counter = CommDebugMode()
    with counter, Ledger() as ledger:
        x.redistribute(mesh, [Replicate()])  # S(0) -> B: one all_gather
        x.redistribute(mesh, [Shard(1)])  # S(0) -> S(1): all_gather + chunk on CPU
    return ledger.records, counter.get_total_counts()


def test_the_ledger_sees_dtensor_collectives_as_comm_debug_mode_does() -> None:
    for records, counted in spawn(_dtensor_traffic, 2, timeout=30):
        functional = [r for r in records if r.op.startswith("functional.")]
        assert len(functional) == counted == 2
        assert {r.op for r in functional} == {"functional.all_gather_into_tensor"}
        # each rank contributes its shard: 3 x 4 float32
        assert [r.bytes for r in functional] == [48, 48]
        assert [r.wire for r in functional] == [48, 48]  # (n - 1) x 48 on 2 ranks
        assert {r.group_size for r in functional} == {2}
        assert {r.ranks for r in functional} == {(0, 1)}  # the mesh's group


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_wire_bytes_are_the_ring_formulas(n: int) -> None:
    t = 4 * 840  # divisible by 2, 3, 4 and 8
    assert ring_wire_bytes("all_reduce", t, n) == 2 * (n - 1) * t // n
    assert ring_wire_bytes("functional.all_reduce_coalesced", t, n) == (
        2 * (n - 1) * t // n
    )
    # an all_gather's rank hands in its piece T/n and sends n-1 pieces
    assert ring_wire_bytes("all_gather_into_tensor", t // n, n) == (n - 1) * t // n
    assert ring_wire_bytes("reduce_scatter_tensor", t, n) == (n - 1) * t // n
    assert ring_wire_bytes("all_to_all_single", t, n) == (n - 1) * t // n
    # a chain broadcast from the root: every rank but the last forwards T
    chain = [ring_wire_bytes("broadcast", t, n, at) for at in range(n)]
    assert chain == [t] * (n - 1) + [0]
    assert [ring_wire_bytes("reduce", t, n, at) for at in range(n)] == [0] + [t] * (
        n - 1
    )
    assert ring_wire_bytes("barrier", 0, n) == 0
    assert ring_wire_bytes("all_reduce", t, 1) == 0  # a group of one sends nothing


def test_reduce_scatter_and_all_gather_cost_the_same_and_all_reduce_both() -> None:
    """The book's convention in one line: never 3x between the two halves."""
    t, n = 4096, 4
    scatter = ring_wire_bytes("reduce_scatter", t, n)
    gather = ring_wire_bytes("all_gather", t // n, n)
    assert scatter == gather == 3 * t // 4
    assert ring_wire_bytes("all_reduce", t, n) == scatter + gather


ROW = 3  # float32 values per row of the uneven all_to_all_single: 12 bytes


def _all_to_alls() -> dict[str, list[int]]:
    """Uneven and even all_to_alls on this rank under a Ledger: wire bytes per call.

    Rank r sends rank j r + j + 1 rows of ROW float32, so what it receives from
    rank j has the same length. gloo's list all_to_all wants pieces of one size
    ("invalid tensor size"): the list runs even here, uneven in-process below; and
    gloo has a list all_to_all only from torch 2.12 (`torchcompat.GLOO_ALL_TO_ALL`)."""
    import torch.distributed._functional_collectives as funcol

    r, n = dist.get_rank(), dist.get_world_size()
    splits = [r + j + 1 for j in range(n)]  # symmetric: sent to j == received from j
    rows = torch.ones(sum(splits), ROW)
    with Ledger() as ledger:
        dist.all_to_all_single(torch.empty_like(rows), rows, splits, splits)
        if GLOO_ALL_TO_ALL:
            dist.all_to_all([torch.empty(5)] * n, [torch.ones(5) for _ in range(n)])
        dist.all_to_all_single(torch.empty(8 * n), torch.ones(8 * n))  # even pieces
        funcol.all_to_all_single(rows, splits, splits, dist.group.WORLD).wait()
    return {"wire": [rec.wire for rec in ledger.records], "splits": splits}


def test_an_all_to_all_is_counted_exactly_from_its_pieces() -> None:
    """Uneven pieces: the bytes addressed to the other ranks, not (n-1)T/n; even
    pieces: (n-1)T/n, the ring's share, which is the same thing."""
    n = 4
    for r, got in enumerate(spawn(_all_to_alls, n, timeout=60)):
        away = sum(got["splits"]) - got["splits"][r]  # its own piece stays
        single, listed, even = 4 * ROW * away, 3 * 5 * 4, 3 * 8 * 4
        listed_if_there = [listed] if GLOO_ALL_TO_ALL else []
        assert got["wire"] == [single, *listed_if_there, even, single], r
        ring = ring_wire_bytes("all_to_all", 4 * ROW * sum(got["splits"]), n)
        assert single != ring  # the ring's share would miscount this rank


def test_an_uneven_all_to_all_list_counts_the_other_entries() -> None:
    """A list all_to_all (NCCL takes uneven entries): every entry but its own."""
    pieces = [torch.ones(k) for k in (1, 2, 3, 4)]  # 4, 8, 12, 16 bytes
    sent = [all_to_all_wire(pieces, None, 4, me) for me in range(4)]
    assert sent == [40 - 4, 40 - 8, 40 - 12, 40 - 16]  # 40 handed in, less its own
    assert all_to_all_wire(pieces, None, 1, 0) == 0  # a group of one sends nothing

"""distcourse.comm.p2p on real gloo ranks: tensors arrive whole, mismatches fail fast
on both ends, and a Ledger sees exactly the header, ack and data messages."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from spawned import assert_says
from torch import Tensor

from distcourse.comm import p2p
from distcourse.comm.ledger import Ledger
from distcourse.launch import spawn
from distcourse.runtime import RankError

HEADER_BYTES = p2p.HEADER_LEN * 8  # int64 header; the ack is the same size


def _tensors() -> list[Tensor]:
    """Many dtypes; 0-d, empty, non-contiguous, 8-d tensors. The same on all ranks."""
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(2, 3, 4, generator=gen)
    return [
        base,
        base.double(),
        (base * 10).long(),
        base.bfloat16(),
        base.half(),
        base > 0,
        base.to(torch.complex64),
        (base * 10).to(torch.int8),
        torch.tensor(3.5),
        torch.empty(0),
        torch.empty(3, 0, 2, dtype=torch.int64),
        base.transpose(0, 2),  # not contiguous
        torch.arange(256.0).view([2] * 8),  # the most dims a header holds
    ]


def _same(got: Tensor, want: Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
    assert torch.equal(got, want), (got, want)


def _round_trip() -> int:
    """Rank 0 sends each tensor to rank 1, which checks it and sends it back."""
    me = dist.get_rank()
    for x in _tensors():
        if me == 0:
            p2p.send_tensor(x, 1)
            _same(p2p.recv_tensor(1, expect=(x.shape, x.dtype)), x)
        else:
            got = p2p.recv_tensor(0)
            _same(got, x)
            assert got.is_contiguous()
            p2p.send_tensor(got, 0)
    return len(_tensors())


def test_round_trip_of_every_kind_of_tensor() -> None:
    assert spawn(_round_trip, 2, timeout=10) == [len(_tensors())] * 2


def _patterns() -> dict[str, list]:
    """Four ranks: a pipeline, a ring shift and pairwise swaps, shapes per rank."""
    me, n = dist.get_rank(), dist.get_world_size()
    out = {}
    # a pipeline: each stage adds one and passes it on
    x = torch.zeros(2, 3) if me == 0 else p2p.recv_tensor(me - 1)
    if me < n - 1:
        p2p.send_tensor(x + 1, me + 1)
    out["pipeline"] = x.tolist()
    # a ring shift: everyone sends right and receives from the left, at once
    got = p2p.send_recv(torch.full((me + 1, 2), me), (me + 1) % n, (me - 1) % n)
    out["ring"] = got.tolist()
    # neighbours swap: 0 <-> 1, 2 <-> 3, each sending and receiving at once
    peer = me ^ 1
    out["swap"] = p2p.send_recv(torch.tensor([me] * (me + 1)), peer, peer).tolist()
    return out


def test_pipeline_ring_and_swap_on_four_ranks() -> None:
    results = spawn(_patterns, 4, timeout=10)
    for rank, got in enumerate(results):
        assert got["pipeline"] == [[float(rank)] * 3] * 2
        left = (rank - 1) % 4
        assert got["ring"] == [[left, left]] * (left + 1)
        assert got["swap"] == [rank ^ 1] * ((rank ^ 1) + 1)


def _one_way(x: Tensor, expect: p2p.Expect) -> None:
    """Rank 0 sends x; rank 1 receives it, expecting `expect`."""
    if dist.get_rank() == 0:
        p2p.send_tensor(x, 1)
    else:
        p2p.recv_tensor(0, expect=expect)


def _mismatches() -> list[str]:
    """Refused transfers: both ranks raise, long before the 5 s group timeout."""
    me = dist.get_rank()
    start, errors = time.monotonic(), []
    wide, narrow = torch.zeros(4, 16), ((4, 8), torch.float32)
    attempts = [
        lambda: _one_way(wide, narrow),
        lambda: _one_way(wide.double(), (wide.shape, torch.float32)),
        # a swap refused one way only: the other way still arrives, then both raise
        lambda: p2p.send_recv(
            wide if me == 0 else torch.ones(2),
            1 - me,
            1 - me,
            expect=narrow if me == 1 else None,
        ),
    ]
    for attempt in attempts:
        with pytest.raises(ValueError) as err:
            attempt()
        errors.append(str(err.value))
    assert time.monotonic() - start < 2.5, "a refusal waited for a timeout"
    # nothing stray is left on the wire: the next transfer is clean
    x = p2p.send_recv(torch.full((2,), me), 1 - me, 1 - me)
    assert x.tolist() == [1 - me] * 2
    return errors


def test_a_mismatch_raises_on_both_ranks_naming_both() -> None:
    errors = spawn(_mismatches, 2, timeout=5)
    sent = "rank 1 expected float32[4, 8] from rank 0, which sent float32[4, 16]"
    assert errors[0][0] == f"send_tensor: {sent}"
    assert errors[1][0] == f"recv_tensor: {sent}"
    dtype = "rank 1 expected float32[4, 16] from rank 0, which sent float64[4, 16]"
    assert [e[1].split(": ", 1)[1] for e in errors] == [dtype, dtype]
    assert errors[0][2] == errors[1][2] == f"send_recv: {sent}"


def _refused() -> None:
    _one_way(torch.zeros(3), ((3,), torch.int64))


def test_a_refusal_reaches_the_caller_as_rank_error() -> None:
    with pytest.raises(
        RankError, match="expected int64\\[3\\] from rank 0, which sent"
    ):
        spawn(_refused, 2, timeout=5)


def _bad_arguments() -> dict[str, str]:
    """Errors found before any message: the Ledger stays empty, the next send works."""
    me, x = dist.get_rank(), torch.zeros(2)
    calls = {
        "self": lambda: p2p.send_tensor(x, me),
        "recv self": lambda: p2p.recv_tensor(me),
        "range": lambda: p2p.send_tensor(x, 2),
        "negative": lambda: p2p.recv_tensor(-1),
        "not a tensor": lambda: p2p.send_tensor([1.0, 2.0], 1 - me),
        "dtype": lambda: p2p.send_tensor(x.to(torch.uint16), 1 - me),
        "dims": lambda: p2p.send_tensor(torch.zeros([1] * 9), 1 - me),
        "expect": lambda: p2p.recv_tensor(1 - me, expect=((-1,), torch.float32)),
        "swap half": lambda: p2p.send_recv(x, 1 - me, me),
    }
    errors = {}
    with Ledger() as ledger:
        for name, call in calls.items():
            with pytest.raises((ValueError, TypeError)) as err:
                call()
            errors[name] = f"{type(err.value).__name__}: {err.value}"
    assert ledger.records == []
    assert p2p.send_recv(x + me, 1 - me, 1 - me).tolist() == [1 - me] * 2
    return errors


def test_bad_arguments_fail_before_any_message() -> None:
    errors = spawn(_bad_arguments, 2, timeout=5)[0]
    assert errors["self"] == (
        "ValueError: send_tensor: dst=0 is this rank itself; a rank can only send to "
        "and receive from other ranks"
    )
    assert errors["not a tensor"] == (
        "TypeError: send_tensor: expected a Tensor to send, got list"
    )
    assert_says(
        errors,
        {
            "recv self": "recv_tensor: src=0 is this rank itself",
            "range": "dst=2 is not a rank of the group (valid: 0..1)",
            "negative": "src=-1 is not a rank of the group",
            "dtype": "unsupported dtype torch.uint16",
            "dims": "must be at most 8 non-negative ints",
            "expect": "shape [-1] must be",
            "swap half": "send_recv: src=0 is this rank itself",
        },
    )


def _ledgers() -> tuple[list[tuple], int, int]:
    """Each message this rank sends or receives, as (op, kind, bytes, peer), and the
    total bytes sent and received."""
    me = dist.get_rank()
    x = torch.zeros(4, 8)  # 128 bytes
    with Ledger() as ledger:
        if me == 0:
            p2p.send_tensor(x, 1)
            p2p.send_tensor(torch.empty(0), 1)  # an empty tensor: no data message
        else:
            p2p.recv_tensor(0, expect=(x.shape, x.dtype))
            p2p.recv_tensor(0)
        p2p.send_recv(x.double(), 1 - me, 1 - me)  # 256 bytes each way
    records = [(r.op, r.kind, r.bytes, r.peer) for r in ledger.records]
    return records, ledger.bytes_sent(), ledger.bytes_received()


def _swap(peer: int, size: int) -> list[tuple]:
    """send_recv's records: three batches (header, ack, data), a send and recv each."""
    h = HEADER_BYTES
    return [
        ("batch_isend_irecv", kind, n, peer)
        for n in (h, h, size)
        for kind in ("send", "recv")
    ]


def test_a_ledger_counts_header_ack_and_data_bytes() -> None:
    h = HEADER_BYTES
    assert h == 80
    (sender, sent0, got0), (receiver, sent1, got1) = spawn(_ledgers, 2, timeout=10)
    one_way = [
        # a tensor: its header, the ack, its 128 bytes
        ("isend", "send", h, 1),
        ("irecv", "recv", h, 1),
        ("isend", "send", 128, 1),
        # an empty tensor: its header, the ack, no data
        ("isend", "send", h, 1),
        ("irecv", "recv", h, 1),
    ]
    assert sender == [*one_way, *_swap(1, 256)]
    # the receiver records each of those messages the other way, from rank 0
    back = {"isend": "irecv", "irecv": "isend", "send": "recv", "recv": "send"}
    mirrored = [(back[op], back[kind], n, 0) for op, kind, n, _ in one_way]
    assert receiver == [*mirrored, *_swap(0, 256)]
    # two headers and 128 bytes one way, two acks back; the swap's 2h + 256 each way
    assert sent0 == got1 == (2 * h + 128) + (2 * h + 256) == 704
    assert got0 == sent1 == (2 * h) + (2 * h + 256) == 576


def _agree(width: int) -> tuple[str, list[tuple[str, int]]]:
    """Each rank announces an 8-wide tensor to the other and expects `width` back
    from rank 1 (rank 0 always expects 8): only headers and acks move."""
    me, other = dist.get_rank(), 1 - dist.get_rank()
    mine = ((2, 8), torch.float32)
    want = ((2, width if me == 0 else 8), torch.float32)
    with Ledger() as ledger:
        try:
            p2p.agree_shapes(
                [(mine, other, None, f"to {other}")], [(want, other, None, f"to {me}")]
            )
            error = ""
        except ValueError as err:
            error = str(err)
    return error, [(r.kind, r.bytes) for r in ledger.records]


def test_agree_shapes_checks_both_directions_at_once_and_moves_no_data() -> None:
    for error, wire in spawn(_agree, 2, 8, timeout=10):
        assert error == ""
        header, ack = ("send", HEADER_BYTES), ("recv", HEADER_BYTES)
        assert sorted(wire) == [ack, ack, header, header]  # one each way, each phase
    errors = [error for error, _ in spawn(_agree, 2, 6, timeout=10)]
    want = "to 0: rank 0 expected float32[2, 6] from rank 1, which sent float32[2, 8]"
    assert errors[0] == errors[1] == want

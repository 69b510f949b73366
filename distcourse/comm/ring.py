"""Collectives built only from point-to-point sends and receives.

Each function mirrors a torch.distributed collective, so a chapter can put the two side
by side and check they agree. Every call goes through the `dist.` module attribute at
call time, so a `Ledger` sees each message. Ring algorithms send 2(N-1)/N * S bytes per
rank for an all-reduce of S bytes, whatever N is; `naive_all_reduce` is the contrast.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse.comm.agree import (
    SUM,
    Group,
    Members,
    agree,
    copy_back,
    members,
    no_key,
    reduce_fn,
    reduce_op,
)

# A chunk travels in pieces of at most PIECE_BYTES, two or more once it reaches
# SPLIT_BYTES: one is reduced while the next is on the wire, as in gloo's own ring.
# Smaller pieces measured slower (each message costs a round of Python, torch and
# gloo bookkeeping); see distcourse.bench.allreduce. Reduce-scatter receives into
# RECV_BUFFERS piece-sized buffers taken in turn.
PIECE_BYTES = 4 << 20
SPLIT_BYTES = 1 << 20
RECV_BUFFERS = 2


def reduction(
    name: str, tensor: Tensor, op: object, group: Group, check: bool
) -> tuple[Members, Callable[..., Tensor], Tensor]:
    """What every reducing collective here does first: the group's members, the
    ranks' agreement on the tensor and the op (with `check`, one all_gather of 112
    bytes), the op's elementwise function, and the tensor flat (a view when it is
    contiguous; `copy_back` writes a copy back)."""
    g = members(group, name)
    key = agree(
        name, tensor, group, validate=lambda: reduce_op(op), key_name="op", check=check
    )
    return g, reduce_fn(key), tensor.reshape(-1)


def _check_blocks(
    what: str, blocks: list, as_list: bool, size: int, numel: int, dtype: object
) -> None:
    """ValueError unless `blocks` is `size` tensors of `numel` elements of `dtype`
    (`as_list`), or one tensor of size * numel elements: one block per rank."""
    n, numel = (size, numel) if as_list else (1, size * numel)
    got = [f"{str(b.dtype).removeprefix('torch.')}[{b.numel()}]" for b in blocks]
    if len(blocks) != n or any(b.numel() != numel or b.dtype != dtype for b in blocks):
        raise ValueError(
            f"{what} must be {n} tensor(s) of {numel} {dtype} elements, "
            f"got {', '.join(got)}"
        )


def _agree_blocks(
    name: str,
    role: str,
    given: list[Tensor] | Tensor,
    like: Tensor,
    group: Group,
    check: bool,
    key: Callable[[], int] = no_key,
    key_name: str = "",
) -> tuple[Members, bool, list[Tensor], int]:
    """The validation and agreement of a call whose `given` (its `role`) holds one
    block per rank: N tensors shaped like `like`, or one of N * like.numel()
    elements. Blocks that do not fit raise on this rank before any message; then
    `key()` (a reduction's op, checked) and `like` are agreed across the group.
    Returns (members, whether `given` is a list, its tensors, the agreed key)."""
    g = members(group, name)
    as_list = isinstance(given, list)
    blocks = given if as_list else [given]

    def blocks_fit() -> int:
        what = f"{name}: {role}"
        _check_blocks(what, blocks, as_list, g.size, like.numel(), like.dtype)
        return key()

    agreed = agree(
        name, like, group, validate=blocks_fit, key_name=key_name, check=check
    )
    return g, as_list, blocks, agreed


def _piece_count(chunk: Tensor) -> int:
    """How many pieces each chunk is cut into (chunks differ by one element at most)."""
    nbytes = chunk.numel() * chunk.element_size()
    count = -(-nbytes // PIECE_BYTES)
    return max(count, 2) if nbytes >= SPLIT_BYTES else max(count, 1)


def _pieces(chunks: list, count: int) -> list:
    """The pieces of the chunks sent (or received) step after step, in order."""
    return [piece for chunk in chunks for piece in chunk.tensor_split(count)]


def _stream(
    sends: list,
    recvs: list,
    g: Members,
    send_ahead: int,
    recv_ahead: int,
    arrived: Callable[[int], None] | None = None,
) -> None:
    """Send sends[m] right and receive recvs[m] from the left, m = 0, 1, ...; run
    `arrived(m)` once message m is in.

    Send m and receive m go out together, as one `batch_isend_irecv`: exchange m. It
    is posted once message m - ahead is in, ahead = min(send_ahead, recv_ahead): send
    m's data is ready once message m - send_ahead is in, receive m's buffer free once
    message m - recv_ahead is in. So `ahead` exchanges stream through all the ring's
    steps, with no wait at a step's end. Empty pieces are skipped on both ends.
    Returns once every exchange has completed, so the caller may overwrite what was
    sent.

    Why one batch per exchange: NCCL ignores tags and runs the point-to-point calls
    issued on one communicator in issue order, and a send larger than its buffers
    completes only when the matching receive runs (NVIDIA/nccl#479; torch's docs of
    `isend`). Had every rank posted its send alone, each would wait for a receive
    its neighbour has not reached: a hang once a piece outgrows NCCL's buffers. The
    ops of one `batch_isend_irecv` run as one group, and every rank posts the same
    sequence of exchanges, so exchange m's send meets the right neighbour's exchange
    m receive, both in flight together (the fix NVIDIA/nccl#479 gives, and the one
    Megatron's and torch's pipelining use).
    """
    total, ahead = len(sends), min(send_ahead, recv_ahead)
    works: list = [[] for _ in range(total)]

    def exchange(m: int) -> None:
        if m < total:
            ops = [
                (dist.isend, sends[m], g.peer(1)),
                (dist.irecv, recvs[m], g.peer(-1)),
            ]
            works[m] = _post([dist.P2POp(fn, t, peer, g.group) for fn, t, peer in ops])

    for m in range(ahead):
        exchange(m)
    for m in range(total):
        for work in works[m]:
            work.wait()
        if arrived is not None:
            arrived(m)
        exchange(m + ahead)


def _post(ops: list) -> list:
    """Start the ops with a tensor, as one batch (none if all are empty): the same
    call on NCCL and gloo, and the one a Ledger records for every ring message."""
    ops = [op for op in ops if op.tensor.numel()]
    return dist.batch_isend_irecv(ops) if ops else []


def _reduce_scatter_ring(chunks: list, g: Members, reduce: Callable) -> None:
    """N-1 steps; afterwards chunks[g.rank] holds the reduction over all ranks.

    Step s sends chunk rank-s-1 (reduced in step s-1) and adds the received one into
    chunk rank-s-2, piece by piece. A piece goes out as soon as it is reduced; pieces
    arrive in RECV_BUFFERS piece-sized buffers taken in turn and are added in place
    into the chunk's view: no chunk-sized scratch, no copy.
    """
    me, n, count = g.rank, g.size, _piece_count(chunks[0])
    sends = _pieces([chunks[(me - s - 1) % n] for s in range(n - 1)], count)
    parts = _pieces([chunks[(me - s - 2) % n] for s in range(n - 1)], count)
    bufs = chunks[0].new_empty(RECV_BUFFERS, -(-chunks[0].numel() // count))
    recvs = [bufs[m % RECV_BUFFERS, : len(part)] for m, part in enumerate(parts)]

    def add(m: int) -> None:
        reduce(parts[m], recvs[m], out=parts[m])

    _stream(sends, recvs, g, send_ahead=count, recv_ahead=RECV_BUFFERS, arrived=add)


def _all_gather_ring(chunks: list, g: Members) -> None:
    """N-1 steps; each rank starts with chunks[g.rank] and ends with all of them.

    Step s forwards chunk rank-s (received in step s-1) and receives chunk rank-s-1
    straight into place, so every receive can be posted at once.
    """
    me, n, count = g.rank, g.size, _piece_count(chunks[0])
    sends = _pieces([chunks[(me - s) % n] for s in range(n - 1)], count)
    recvs = _pieces([chunks[(me - s - 1) % n] for s in range(n - 1)], count)
    _stream(sends, recvs, g, send_ahead=count, recv_ahead=len(recvs))


def ring_all_reduce(
    tensor: Tensor, op: object = SUM, group: Group = None, check: bool = True
) -> Tensor:
    """In-place all-reduce: reduce-scatter then all-gather around a ring, 2(N-1) steps.

    Like dist.all_reduce, but returns `tensor`. Any shape and size works: the flat data
    is cut into N chunks, the first numel % N one element longer. `check=True` (same on
    every rank) costs one extra all_gather of 112 bytes per rank, about one latency
    alpha, to turn mismatched calls into a ValueError on every rank.
    """
    g, reduce, flat = reduction("ring_all_reduce", tensor, op, group, check)
    if g.size > 1 and flat.numel():
        chunks = list(torch.tensor_split(flat, g.size))  # N views, uneven allowed
        _reduce_scatter_ring(chunks, g, reduce)
        _all_gather_ring(chunks, g)
    copy_back(tensor, flat)
    return tensor


def ring_all_gather(
    output: list[Tensor] | Tensor,
    tensor: Tensor,
    group: Group = None,
    check: bool = True,
) -> list[Tensor] | Tensor:
    """Gather every rank's `tensor` into `output` around a ring: N-1 steps.

    `output` is a list of N tensors shaped like `tensor` (as dist.all_gather) or one
    tensor of N * tensor.numel() elements, block r from rank r (as
    dist.all_gather_into_tensor). `check` as in ring_all_reduce.
    """
    g, as_list, outs, _ = _agree_blocks(
        "ring_all_gather", "output", output, tensor, group, check
    )
    flats = [o.reshape(-1) for o in outs]
    slots = flats if as_list else list(torch.tensor_split(flats[0], g.size))
    slots[g.rank].copy_(tensor.reshape(-1))
    if tensor.numel():
        _all_gather_ring(slots, g)
    for out, flat in zip(outs, flats, strict=True):
        copy_back(out, flat)
    return output


def ring_reduce_scatter(
    output: Tensor,
    input: list[Tensor] | Tensor,
    op: object = SUM,
    group: Group = None,
    check: bool = True,
) -> Tensor:
    """Reduce across ranks and leave block r on rank r, around a ring: N-1 steps.

    `input` is a list of N tensors, block r going to rank r (as dist.reduce_scatter), or
    one tensor of N * output.numel() elements (as dist.reduce_scatter_tensor); it is
    not modified. `check` as in ring_all_reduce.
    """
    g, _, blocks, key = _agree_blocks(
        "ring_reduce_scatter",
        "input",
        input,
        output,
        group,
        check,
        key=lambda: reduce_op(op),
        key_name="op",
    )
    reduce = reduce_fn(key)
    work = torch.cat([b.reshape(-1) for b in blocks])  # a copy: input stays intact
    chunks = list(torch.tensor_split(work, g.size))  # N equal blocks
    if output.numel():
        _reduce_scatter_ring(chunks, g, reduce)
    output.copy_(chunks[g.rank].view(output.shape))
    return output


def naive_all_reduce(
    tensor: Tensor, op: object = SUM, group: Group = None, check: bool = True
) -> Tensor:
    """All-reduce through one root (group rank 0): it receives, reduces, sends back.

    The root moves 2(N-1) * S bytes one after another, against 2(N-1)/N * S per rank
    for the ring: the contrast that motivates rings. `check` as in ring_all_reduce.
    """
    g, reduce, flat = reduction("naive_all_reduce", tensor, op, group, check)
    if g.rank == 0 and flat.numel():
        buf = torch.empty_like(flat)
        for r in g.ranks[1:]:  # one after another: the root is the bottleneck
            dist.irecv(buf, r, group=g.group).wait()
            reduce(flat, buf, out=flat)
        for work in [dist.isend(flat, r, group=g.group) for r in g.ranks[1:]]:
            work.wait()
    elif flat.numel():
        dist.isend(flat, g.ranks[0], group=g.group).wait()
        dist.irecv(flat, g.ranks[0], group=g.group).wait()
    copy_back(tensor, flat)
    return tensor

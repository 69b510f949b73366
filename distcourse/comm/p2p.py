"""Point-to-point transfers between pipeline stages, with a shape and dtype handshake.

dist.send/dist.recv need the receiver to allocate a buffer of the right shape and dtype
in advance; if it guessed wrong, the transfer hangs or fills the buffer with garbage.
Here every transfer is three messages, each in its own phase:

    1. header  sender -> receiver  int64[10]: a TensorSpec row (dtype, ndim, shape)
    2. ack     receiver -> sender  int64[10]: the header the receiver expected (its
                                   `expect`), or the header it got back if it had none
    3. data    sender -> receiver  only if the ack equals the header; skipped when empty

So a mismatch raises the same ValueError on both ranks, naming both, and no data
moves. The price: 160 bytes and one round trip (two latencies) before the data, which
matters for small activations; a pipeline with fixed shapes could send headers once.
As with dist.send and dist.recv, every send must meet a receive on its peer, in the
same order. `send_recv` posts its send and its receive of each phase together
(batch_isend_irecv), so two neighbours can swap tensors, or a ring shift them, without
deadlock. Arguments are checked before the first message. Ranks are global ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import runtime
from distcourse.comm.agree import Group, Members, members
from distcourse.comm.spec import MAX_DIMS, TensorSpec

HEADER_LEN = TensorSpec.LENGTH  # a header is a TensorSpec row
# what gloo and NCCL both send; TensorSpec encodes any dtype, p2p refuses the rest
SENDABLE = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.complex64,
    torch.complex128,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
)
Expect = tuple[tuple[int, ...] | torch.Size, torch.dtype]  # (shape, dtype)


def _header(shape: tuple[int, ...], dtype: torch.dtype, name: str) -> list[int]:
    """The header for a tensor of this shape and dtype, or ValueError if it has none."""
    if dtype not in SENDABLE:
        kinds = ", ".join(str(d).removeprefix("torch.") for d in SENDABLE)
        raise ValueError(f"{name}: unsupported dtype {dtype!r}; supported: {kinds}")
    if len(shape) > MAX_DIMS or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise ValueError(
            f"{name}: shape {list(shape)} must be at most {MAX_DIMS} non-negative ints"
        )
    return TensorSpec(tuple(shape), dtype).encode()


def _parse(header: list[int], src: int, name: str) -> TensorSpec:
    """The TensorSpec of a received header; ValueError if it is not one of ours."""
    spec = TensorSpec.decode(header)
    if spec is None or spec.dtype not in SENDABLE:
        raise ValueError(
            f"{name}: rank {src} sent {header}, not a send_tensor header: "
            "are its sends paired with this rank's receives?"
        )
    return spec


def _show(header: list[int]) -> str:
    """A header as the tensor it describes, e.g. "float32[4, 8]"."""
    return str(TensorSpec.decode(header))


def _mismatch(
    name: str, receiver: int, want: list[int], sender: int, got: list[int]
) -> ValueError:
    return ValueError(
        f"{name}: rank {receiver} expected {_show(want)} from rank "
        f"{sender}, which sent {_show(got)}"
    )


def _peer(peer: object, what: str, g: Members, name: str) -> int:
    """`peer` as a global rank of the group other than this one, or ValueError."""
    if not isinstance(peer, int) or isinstance(peer, bool) or peer not in g.ranks:
        valid = f"0..{g.size - 1}" if g.ranks == list(range(g.size)) else g.ranks
        raise ValueError(
            f"{name}: {what}={peer!r} is not a rank of the group (valid: {valid})"
        )
    if peer == g.ranks[g.rank]:
        raise ValueError(
            f"{name}: {what}={peer} is this rank itself; a rank can only "
            "send to and receive from other ranks"
        )
    return peer


def _blank(device: torch.device) -> Tensor:
    return torch.empty(HEADER_LEN, dtype=torch.int64, device=device)


def _phase(
    sends: list[tuple[Tensor, int]], recvs: list[tuple[Tensor, int]], g: Members
) -> None:
    """Post these sends and receives together, then wait for all of them.

    One message goes by dist.isend/irecv; more by one batch_isend_irecv, so that two
    ranks sending to each other cannot deadlock. Looked up at call time: a Ledger
    sees each message.
    """
    ops = [(dist.isend, t, p) for t, p in sends]
    ops += [(dist.irecv, t, p) for t, p in recvs]
    if len(ops) == 1:
        fn, t, p = ops[0]
        works = [fn(t, p, group=g.group)]
    else:  # none, or a batch
        batch = [dist.P2POp(fn, t, p, g.group) for fn, t, p in ops]
        works = dist.batch_isend_irecv(batch) if batch else []
    for work in works:
        work.wait()


def _transfer(
    name: str,
    x: Tensor | None,
    dst: int | None,
    src: int | None,
    group: Group,
    expect: Expect | None,
) -> Tensor | None:
    """The three phases; a send when dst is given, a receive when src is."""
    g = members(group, name)
    me, device = g.ranks[g.rank], runtime.device()
    mine = want = theirs = None  # headers: sent, expected, received
    if dst is not None and not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a Tensor to send, got {type(x).__name__}")
    if dst is not None:  # check everything before the first message
        dst = _peer(dst, "dst", g, name)
        mine = _header(tuple(x.shape), x.dtype, name)
    if src is not None:
        src = _peer(src, "src", g, name)
        want = None if expect is None else _header(tuple(expect[0]), expect[1], name)
    # 1. headers
    header = [(torch.tensor(mine, device=device), dst)] if dst is not None else []
    got = [(_blank(device), src)] if src is not None else []
    _phase(header, got, g)
    if got:
        theirs = got[0][0].tolist()
        arriving = _parse(theirs, src, name)
        want = want or theirs  # no expectation: accept what came
    # 2. acks: the receiver tells the sender what it expected
    ack = [(_blank(device), dst)] if header else []
    _phase([(torch.tensor(want, device=device), src)] if got else [], ack, g)
    errors = []
    send_ok = bool(header) and ack[0][0].tolist() == mine
    if header and not send_ok:
        _parse(expected := ack[0][0].tolist(), dst, name)
        errors.append(_mismatch(name, dst, expected, me, mine))
    recv_ok = bool(got) and want == theirs
    if got and not recv_ok:
        errors.append(_mismatch(name, me, want, src, theirs))
    # 3. data, in each direction that was accepted; empty tensors need no message
    result = None
    if recv_ok:
        result = torch.empty(arriving.shape, dtype=arriving.dtype, device=device)
    data = [(x.contiguous(), dst)] if send_ok and x.numel() else []
    into = [(result, src)] if recv_ok and result.numel() else []
    _phase(data, into, g)
    if errors:  # raised only now: the other direction has finished
        raise errors[0] if len(errors) == 1 else ValueError("; ".join(map(str, errors)))
    return result


def send_recv(
    x: Tensor, dst: int, src: int, group: Group = None, expect: Expect | None = None
) -> Tensor:
    """Send x to `dst` and receive from `src` at once; return what arrived.

    Each phase posts its send and its receive together, so neighbours that send to
    each other (dst == src) or a ring (dst, src = right, left) cannot deadlock. The
    peers call send_recv too, or recv_tensor / send_tensor for their half. `expect` as
    in recv_tensor; a refusal in one direction lets the other finish, then raises.
    """
    return _transfer("send_recv", x, dst, src, group, expect)


def send_tensor(x: Tensor, dst: int, group: Group = None) -> None:
    """Send x to rank `dst`, which must receive it with recv_tensor (or send_recv).

    Returns once the data is sent; ValueError, on both ranks, if `dst` expected a
    different shape or dtype.
    """
    _transfer("send_tensor", x, dst, None, group, None)


def recv_tensor(src: int, group: Group = None, expect: Expect | None = None) -> Tensor:
    """The tensor rank `src` sends with send_tensor, allocated here from its header.

    `expect=(shape, dtype)` refuses anything else: no data moves, and both ranks raise
    ValueError naming both.
    """
    return _transfer("recv_tensor", None, None, src, group, expect)


Wire = tuple[Expect, int, Group, str]  # (shape, dtype), peer, group, what it carries


def agree_shapes(sends: list[Wire], recvs: list[Wire]) -> None:
    """The handshake alone, for many transfers at once, before any of their data.

    A sender whose shapes are fixed (a pipeline stage after shape inference) can shake
    hands once and then send bare tensors. For each entry of `sends` this rank sends
    the header of what it will send to that peer; for each of `recvs` it receives a
    header, and acks with the header it expects. All headers go out, then all acks,
    each phase posted at once, so neighbours that send to each other cannot
    deadlock. Entries to one peer over one group are matched in order, as the data
    will be. A mismatch raises the same ValueError on both ranks, naming both and
    starting with the entry's label (what the transfer carries).
    """
    name = "agree_shapes"
    out = [
        (_header(tuple(s), d, name), _peer(p, "dst", members(g, name), name), g, w)
        for (s, d), p, g, w in sends
    ]
    into = [
        (_header(tuple(s), d, name), _peer(p, "src", members(g, name), name), g, w)
        for (s, d), p, g, w in recvs
    ]
    device = runtime.device()
    got = [_blank(device) for _ in into]
    acks = [_blank(device) for _ in out]
    for phase in ((out, into, got), (into, out, acks)):  # headers, then acks
        sent, answered, blanks = phase
        works = [
            dist.isend(torch.tensor(h, device=device), p, group=g)
            for h, p, g, _ in sent
        ]
        works += [
            dist.irecv(t, e[1], group=e[2])
            for t, e in zip(blanks, answered, strict=True)
        ]
        for work in works:
            work.wait()
    me = dist.get_rank()
    errors = []
    for (want, src, _, what), header in zip(into, got, strict=True):
        theirs = header.tolist()
        _parse(theirs, src, name)
        if theirs != want:
            errors.append(_mismatch(what, me, want, src, theirs))
    for (mine, dst, _, what), ack in zip(out, acks, strict=True):
        expected = ack.tolist()
        _parse(expected, dst, name)
        if expected != mine:
            errors.append(_mismatch(what, dst, expected, me, mine))
    if errors:  # the receiver's and the sender's view of one link read the same
        errors.sort(key=str)
        raise errors[0] if len(errors) == 1 else ValueError("; ".join(map(str, errors)))

"""A ledger of one rank's communication: every torch.distributed call made while active.

`with Ledger() as ledger:` swaps the functions in the `torch.distributed` namespace
(all_reduce, isend, ...) for wrappers that write a Record, then calls the original.
The originals come back on exit, also after an exception. DTensor and other
functional collectives (`torch.ops._c10d_functional.*`) bypass those names; once
their module is imported (DTensor does it), a dispatch mode active in the same block
records them too, as `functional.<name>`.
Calls made from C++ (torch DDP's bucket all-reduces) reach neither and stay unseen.

Bytes follow the book's one convention: what crosses the wire per rank for the
algorithm that runs. Sends are counted as they are; an all_to_all too, piece by
piece: each rank sends each peer its piece directly, so the wire carries the pieces
addressed to the other ranks (`all_to_all_wire`), which is (n-1)T/n only when the
pieces are even. Other library collectives, whose algorithm the ledger cannot see,
as the ring runs them (`ring_wire_bytes`).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils._python_dispatch import TorchDispatchMode

from distcourse import tables

# collective: (argument holding what this rank contributes, argument naming the root)
_COLLECTIVES: dict[str, tuple[str | None, str | None]] = {
    "all_reduce": ("tensor", None),
    "reduce": ("tensor", None),
    "broadcast": ("tensor", "src"),  # only the source contributes
    "all_gather": ("tensor", None),
    "all_gather_into_tensor": ("input_tensor", None),
    "all_gather_single": ("input_tensor", None),  # newer torch
    "gather": ("tensor", None),
    "scatter": ("scatter_list", "src"),  # only the source contributes
    "reduce_scatter": ("input_list", None),
    "reduce_scatter_tensor": ("input", None),
    "reduce_scatter_single": ("input", None),  # newer torch
    "all_to_all": ("input_tensor_list", None),
    "all_to_all_single": ("input", None),
    "barrier": (None, None),
}
# point-to-point call: (direction, argument naming the peer)
_P2P = {
    "send": ("send", "dst"),
    "isend": ("send", "dst"),
    "recv": ("recv", "src"),
    "irecv": ("recv", "src"),
}


# DTensor imports it. A ledger watches functional collectives only where it is
# loaded: entering a dispatch mode imports torch._dynamo, a heavy import
_FUNCTIONAL_MODULE = "torch.distributed._functional_collectives"
# functional collective: positional index of its group size (None: ask the group)
_FUNCTIONAL: dict[str, int | None] = {
    "all_reduce": None, "all_reduce_coalesced": None,
    "all_gather_into_tensor": 1, "all_gather_into_tensor_coalesced": 1,
    "reduce_scatter_tensor": 2, "reduce_scatter_tensor_coalesced": 2,
    "all_to_all_single": None, "broadcast": None,
}  # fmt: skip  # table


@dataclass(frozen=True)
class Record:
    """One call: its name, direction, payload, wire bytes, and who was at the other end.

    `bytes` is what the call names: a point-to-point message, or what this rank hands
    to a collective. `wire` is what this rank puts on the wire for it: the message
    itself for a send, none for a receive, for an all_to_all the pieces it sends to
    the other ranks (`all_to_all_wire`), and for another collective the share of
    this rank under the ring algorithm (`ring_wire_bytes`).
    """

    op: str  # the torch.distributed function, e.g. "isend" or "all_reduce"
    kind: str  # "send" or "recv" (point-to-point), or "collective"
    bytes: int  # sent/received payload; for a collective, this rank's contribution
    peer: int | None  # global rank of the other side (point-to-point only)
    group_size: int
    ranks: tuple[int, ...] = ()  # the group's global ranks (empty where unknown)
    wire: int = 0  # bytes this rank put on the wire for this call


# How many of its `bytes` (what a rank hands in) a rank puts on the wire, in units of
# bytes / n, under the ring algorithm: all_reduce = reduce_scatter + all_gather.
_RING_SHARE: dict[str, Callable[[int], int]] = {
    "all_reduce": lambda n: 2 * (n - 1),  # 2(n-1)T/n
    "all_gather": lambda n: (n - 1) * n,  # hands in T/n, forwards n-1 pieces
    "reduce_scatter": lambda n: n - 1,  # hands in T, sends n-1 pieces of T/n
    "all_to_all": lambda n: n - 1,  # keeps its own piece
    "scatter": lambda n: n - 1,  # the root keeps its own piece
}


def _ring_family(op: str) -> str:
    """The collective an op is a form of: 'functional.all_gather_into_tensor' and
    'all_gather_single' are all_gathers."""
    name = op.removeprefix("functional.").removesuffix("_coalesced")
    for family in _RING_SHARE:
        if name.startswith(family):
            return family
    return name


def ring_wire_bytes(op: str, handed_in: int, group_size: int, position: int = 0) -> int:
    """Bytes one rank puts on the wire for collective `op` under the ring algorithm.

    The book's one convention (chapter 2): what crosses the wire per rank for the
    algorithm that runs. The ledger cannot see inside gloo or NCCL, so it counts
    their collectives as the bandwidth-optimal ring runs them, for a tensor of T
    bytes on n ranks: all_reduce 2(n-1)T/n; all_gather, reduce_scatter and
    all_to_all (n-1)T/n each (an all_gather's rank hands in T/n). That share of
    an all_to_all is its even case only: the ledger counts an all_to_all exactly,
    from its pieces (`all_to_all_wire`). Broadcast and
    reduce run as a chain from (to) the root, `position` steps along it: every
    rank but the last (the root) sends T once. Gather sends a rank's piece to the
    root. A share that is not a whole number of bytes is rounded down.
    """
    n = group_size
    if n <= 1:
        return 0
    family = _ring_family(op)
    if family in _RING_SHARE:
        return handed_in * _RING_SHARE[family](n) // n
    if family == "broadcast":
        return handed_in if position < n - 1 else 0
    if family in ("reduce", "gather"):
        return handed_in if position != 0 else 0
    return 0  # barrier, and anything unknown: no payload


def all_to_all_wire(
    data: Any, splits: list[int] | None, group_size: int, me: int
) -> int:
    """Bytes rank `me` of a group puts on the wire in an all_to_all: the pieces it
    addresses to the other ranks (its own stays). `data` is what it hands in: a
    list of n tensors (`all_to_all`: every entry but entry `me`), or one tensor
    split along dim 0 by `splits` (`all_to_all_single`'s input_split_sizes: the
    rows not addressed to `me`, times a row's bytes); no `splits` means n even
    pieces, (n-1)T/n, the ring's share."""
    if group_size <= 1 or not 0 <= me < group_size:
        return 0
    if not isinstance(data, torch.Tensor):  # a list: one piece per rank
        return sum(_nbytes(t) for i, t in enumerate(data) if i != me)
    total = _nbytes(data)
    if not splits:
        return ring_wire_bytes("all_to_all", total, group_size)
    rows = data.shape[0] if data.dim() else 1
    row = total // rows if rows else 0
    return (sum(splits) - splits[me]) * row


def _nbytes(data: Any) -> int:
    if data is None:
        return 0
    if isinstance(data, torch.Tensor):
        return data.numel() * data.element_size()
    return sum(_nbytes(t) for t in data)  # a list of tensors


def _global_rank(args: dict, name: str) -> int | None:
    """The global rank an argument names, given as `name` or as `group_<name>`."""
    if args.get(name) is not None:
        return args[name]
    if args.get(f"group_{name}") is not None:
        group = args.get("group") or dist.group.WORLD
        return dist.get_global_rank(group, args[f"group_{name}"])
    return None


def _unwrap(fn: Callable) -> Callable:
    while hasattr(fn, "_ledger_original"):
        fn = fn._ledger_original
    return fn


class _P2POp(c10d.P2POp):
    """A P2POp that takes a ledger's wrapped isend/irecv (torch checks identity)."""

    def __new__(cls, op: Callable, *args: Any, **kwargs: Any) -> _P2POp:
        return super().__new__(cls, _unwrap(op), *args, **kwargs)

    def __init__(self, op: Callable, *args: Any, **kwargs: Any) -> None:
        super().__init__(_unwrap(op), *args, **kwargs)


def _functional_group(args: tuple) -> Any:
    """The process group a functional collective names, or None if unknown."""
    try:  # the group's name is the last positional argument
        return c10d._resolve_process_group(args[-1])
    except Exception:  # an older or newer torch
        return None


def _group_size(args: tuple, at: int | None, group: Any) -> int:
    if at is not None:
        return int(args[at])
    return -1 if group is None else group.size()


def _ranks(group: Any) -> tuple[int, ...]:
    """The global ranks of `group` (None: the world)."""
    return tuple(dist.get_process_group_ranks(group or dist.group.WORLD))


def _position(ranks: tuple[int, ...], args: tuple, name: str) -> int:
    """How many steps along a functional broadcast's chain this rank is (0: root)."""
    if name != "broadcast" or dist.get_rank() not in ranks:
        return 0
    return (ranks.index(dist.get_rank()) - int(args[1])) % len(ranks)


class _FunctionalSpy(TorchDispatchMode):
    """Sees every functional collective (DTensor's redistribute, for one)."""

    def __init__(self, records: list[Record]) -> None:
        super().__init__()
        self.records = records

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func.overloadpacket.__name__
        if func.namespace == "_c10d_functional" and name in _FUNCTIONAL:
            group = _functional_group(args)
            size = _group_size(args, _FUNCTIONAL[name], group)
            ranks = () if group is None else _ranks(group)
            op, handed = f"functional.{name}", _nbytes(args[0])
            wire = ring_wire_bytes(op, handed, size, _position(ranks, args, name))
            if name == "all_to_all_single" and dist.get_rank() in ranks:
                me = ranks.index(dist.get_rank())
                wire = all_to_all_wire(args[0], list(args[2]), size, me)
            record = Record(op, "collective", handed, None, size, ranks, wire)
            self.records.append(record)
        return func(*args, **(kwargs or {}))


class Ledger:
    """Record every torch.distributed call this rank makes inside a `with` block.

    `ledger.records` lists them; `bytes_sent`, `bytes_received` and `summary` add them
    up. Python calls through the module attribute, like `dist.isend(...)`, and
    functional collectives (DTensor's) are seen. Calls made from C++, such as torch
    DDP's gradient all-reduces, and functions imported by name before the block are
    invisible to it.
    """

    def __init__(self) -> None:
        self.records: list[Record] = []
        self._saved: dict[str, Any] = {}
        self._spy: _FunctionalSpy | None = None

    def __enter__(self) -> Ledger:
        if self._saved:
            raise RuntimeError("this Ledger is already active")
        names = [n for n in [*_COLLECTIVES, *_P2P] if hasattr(dist, n)]
        for name in [*names, "batch_isend_irecv", "P2POp"]:
            self._saved[name] = getattr(dist, name)
        for name in names:
            setattr(dist, name, self._wrap(name, self._saved[name]))
        dist.batch_isend_irecv = self._wrap_batch(self._saved["batch_isend_irecv"])
        dist.P2POp = _P2POp
        if _FUNCTIONAL_MODULE in sys.modules:  # else no functional collective can run
            self._spy = _FunctionalSpy(self.records)  # (entering one imports _dynamo)
            self._spy.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._spy is not None:
            self._spy.__exit__(*exc)
            self._spy = None
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved = {}

    def _wrap(self, name: str, fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs).arguments
            except TypeError:  # let torch report its own argument errors
                return fn(*args, **kwargs)
            if not dist.is_initialized():  # torch raises its own error, unrecorded
                return fn(*args, **kwargs)
            self._record(name, bound)
            record = self.records[-1]
            self.entering(record, bound)
            result = fn(*args, **kwargs)
            self.returned(record)
            return result

        wrapper._ledger_original = fn
        return wrapper

    def entering(self, record: Record, args: dict[str, Any]) -> None:
        """Called as this rank enters a call, with its Record and bound arguments.

        Nothing here: a hook for subclasses, e.g. comm/recorder.py's FlightRecorder,
        which notes each call before it can hang or abort the process.
        """

    def returned(self, record: Record) -> None:
        """Called when the call `record` describes has returned (an isend: posted)."""

    def _wrap_batch(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(p2p_op_list: list, *args: Any, **kwargs: Any) -> Any:
            for p in p2p_op_list:
                kind = "send" if _unwrap(p.op) is c10d.isend else "recv"
                ranks = _ranks(p.group)
                size = _nbytes(p.tensor)
                wire = size if kind == "send" else 0
                record = Record(
                    "batch_isend_irecv", kind, size, p.peer, len(ranks), ranks, wire
                )
                self.records.append(record)
            return fn(p2p_op_list, *args, **kwargs)

        wrapper._ledger_original = fn
        return wrapper

    def _record(self, op: str, args: dict) -> None:
        ranks = _ranks(args.get("group"))
        size = len(ranks)
        if op in _P2P:
            kind, peer = _P2P[op]
            payload = _nbytes(args.get("tensor"))
            wire = payload if kind == "send" else 0
            peer_rank = _global_rank(args, peer)
            record = Record(op, kind, payload, peer_rank, size, ranks, wire)
        else:
            data, root = _COLLECTIVES[op]
            handed = _nbytes(args.get(data)) if data else 0
            where = self._steps_from_root(args, ranks, op)
            if root and where != 0:
                # a non-root rank hands nothing to a broadcast / scatter, but
                # forwards the root's tensor along a broadcast's chain
                wire = _nbytes(args.get(data)) if op == "broadcast" else 0
                wire = wire if where < size - 1 else 0
                handed = 0
            elif op.startswith("all_to_all") and dist.get_rank() in ranks:
                me, splits = ranks.index(dist.get_rank()), args.get("input_split_sizes")
                wire = all_to_all_wire(args.get(data), splits, size, me)
            else:
                wire = ring_wire_bytes(op, handed, size, where)
            record = Record(op, "collective", handed, None, size, ranks, wire)
        self.records.append(record)

    @staticmethod
    def _steps_from_root(args: dict, ranks: tuple[int, ...], op: str) -> int:
        """How far along the chain from the root (`src` / `dst`) this rank is."""
        root = _global_rank(args, "src" if op in ("broadcast", "scatter") else "dst")
        me = dist.get_rank()
        if root is None or root not in ranks or me not in ranks:
            return 0
        return (ranks.index(me) - ranks.index(root)) % len(ranks)

    def bytes_sent(self, op: str | None = None) -> int:
        """Bytes this rank put on the wire, in calls to `op` (all calls if None).

        The book's one convention: a point-to-point send counts its tensor; an
        all_to_all the pieces it sends to the other ranks (`all_to_all_wire`);
        another collective this rank's share under the ring algorithm
        (`ring_wire_bytes`: an all_reduce of T bytes on n ranks, 2(n-1)T/n).
        Collectives built here from sends (chapter 2's ring) are counted exactly,
        send by send. `handed_in` gives what the calls were handed instead.
        """
        return sum(r.wire for r in self.records if op in (None, r.op))

    def handed_in(self, op: str | None = None) -> int:
        """Bytes this rank handed to collectives `op` (all if None): all_reduce its
        tensor, all_gather its input, a broadcast's root its tensor."""
        return sum(
            r.bytes
            for r in self.records
            if r.kind == "collective" and op in (None, r.op)
        )

    def bytes_received(self, op: str | None = None) -> int:
        """Bytes this rank received by point-to-point calls to `op` (all if None)."""
        return sum(
            r.bytes for r in self.records if r.kind == "recv" and op in (None, r.op)
        )

    def summary(self) -> str:
        """A table, one line per (function, kind): number of records and wire bytes."""
        rows = [("op", "kind", "count", "wire bytes")]
        for op, kind in dict.fromkeys((r.op, r.kind) for r in self.records):
            mine = [r for r in self.records if (r.op, r.kind) == (op, kind)]
            rows.append((op, kind, len(mine), f"{sum(r.wire for r in mine):,}"))
        rows.append(("total sent", "", "", f"{self.bytes_sent():,}"))
        rows.append(("total received", "", "", f"{self.bytes_received():,}"))
        return tables.aligned(rows, widths=(24, 12, 7, 14), align="<<>>", gaps=0)

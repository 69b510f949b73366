"""The agreement check: every rank sees every other rank's call before any data moves.

A collective that ranks call with different shapes, dtypes or ops does not fail by
itself: it hangs until the group's timeout, or silently mixes the wrong data. `agree`
all-gathers a small fixed-size descriptor of this rank's call (about 112 bytes), so
every rank compares the same table and all of them raise the same ValueError, naming
the ranks, instead of some waiting forever. Ring collectives, point-to-point
activation transfers, tensor-parallel layers and boxing all call it first.
`agree_tensors` does the same for a model's parameters (names, shapes, dtypes) and
settings, before `fully_shard`, ZeRO, `ShardedDDP` and `shard_experts` build flat
buffers from them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import runtime
from distcourse.comm.spec import DTYPES, TensorSpec

SUM = dist.ReduceOp.SUM
Group = dist.ProcessGroup | None  # None: the default group
# elementwise reductions by name, called as fn(a, b, out=a)
REDUCE_OPS: dict[str, Callable[..., Tensor]] = {
    "sum": torch.add,
    "max": torch.maximum,
    "min": torch.minimum,
    "product": torch.mul,
}
_NAMES: dict[int, str] = {}  # call ids seen on this rank, for readable errors


@dataclass(frozen=True)
class Members:
    """The calling rank's view of a process group: who it is and who its peers are."""

    group: dist.ProcessGroup
    rank: int  # rank inside the group
    size: int
    ranks: list[int]  # global rank of each group rank

    def peer(self, offset: int) -> int:
        """Global rank of the group member `offset` places to the right (ring order)."""
        return self.ranks[(self.rank + offset) % self.size]


def members(group: Group, name: str) -> Members:
    """This rank's Members of `group`; ValueError if it is not a member."""
    runtime.require_initialized()
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            f"{name}: rank {dist.get_rank()} is not a member of the group it was "
            "given; only members may call a collective on a group"
        )
    size = dist.get_world_size(group)
    ranks = [dist.get_global_rank(group, r) for r in range(size)]
    return Members(group, rank, size, ranks)


def reduce_op(op: object) -> int:
    """Index of `op` (a ReduceOp or a name like "sum") in REDUCE_OPS, or ValueError."""
    name = op if isinstance(op, str) else getattr(op, "name", str(op))
    names = list(REDUCE_OPS)
    if name.lower() not in names:
        supported = ", ".join(n.upper() for n in names)
        raise ValueError(f"unsupported reduce op {op!r}; use one of {supported}")
    return names.index(name.lower())


def reduce_fn(index: int) -> Callable[..., Tensor]:
    """The elementwise function of the op at `index` (from `reduce_op`)."""
    return list(REDUCE_OPS.values())[index]


def copy_back(tensor: Tensor, flat: Tensor) -> None:
    """Write `flat` (made by tensor.reshape(-1)) back, where reshape made a copy."""
    if not tensor.is_contiguous():  # reshape(-1) made a copy, not a view
        tensor.copy_(flat.view(tensor.shape))


def _call_id(name: str) -> int:
    key = zlib.crc32(name.encode()) & 0x7FFFFFFF
    _NAMES[key] = name
    return key


def _describe(name: str, key: int, t: Tensor, ok: bool) -> Tensor:
    """A fixed-size int64 row: [ok, call, key, numel, *TensorSpec row]; a tensor of
    more than MAX_DIMS dims is compared by its numel and ndim. It lives on the rank's
    device, where the group communicates, whatever `t`'s device (a host batch on a GPU
    rank then fails in its own op, with CUDA's message, not in this check)."""
    row = [int(ok), _call_id(name), key, t.numel(), *TensorSpec.of(t).encode()]
    return torch.tensor(row, dtype=torch.int64, device=runtime.device())


def _show(row: list[int], key_name: str) -> str:
    """A descriptor row as a call, e.g. "ring_all_reduce(float32[4, 2], op=SUM)"."""
    _, call, key, numel, *spec = row
    name = _NAMES.get(call, f"<call {call:#x}>")
    decoded = TensorSpec.decode(spec)
    if decoded is None:  # more than MAX_DIMS dims: no sizes in the row
        kind = str(DTYPES[spec[0]]).removeprefix("torch.")
        decoded = f"{kind}<{numel} elements>"
    if key_name == "op" and 0 <= key < len(REDUCE_OPS):
        return f"{name}({decoded}, op={list(REDUCE_OPS)[key].upper()})"
    return f"{name}({decoded}, {key_name}={key})" if key_name else f"{name}({decoded})"


def no_key() -> int:
    """The `validate` of a call with nothing to check but its tensor: key -1."""
    return -1


def agree(
    name: str,
    tensor: Tensor,
    group: Group = None,
    *,
    validate: Callable[[], int] = no_key,
    key_name: str = "",
    check: bool = True,
    explain: Callable[[], str] | None = None,
) -> int:
    """Check this call on this rank, then (if `check`) that all ranks make the same one.

    `validate` checks the arguments on this rank (raising ValueError or TypeError,
    raised here after the gather, while the other ranks raise a ValueError naming
    this one) and returns an integer key that must also agree, shown as `key_name`
    in errors (an op index for "op", a source rank for "src", ...). Returns that
    key. With `check`, every rank of `group` must call `agree` with the same
    `check`: it is one all_gather of `tensor`'s TensorSpec, `name` and the key
    (none in a group of one rank). When the ranks' calls differ, every rank calls
    `explain` (if given: it may run a collective, as all ranks reach it) for the
    error's text.
    """
    return _agreed(name, tensor, group, validate, key_name, check, explain, None)[0]


def agree_lengths(
    name: str,
    tensor: Tensor,
    dim: int,
    group: Group = None,
    *,
    validate: Callable[[], int] = no_key,
    key_name: str = "",
    check: bool = True,
) -> tuple[int, list[int] | None]:
    """`agree` on `tensor` but for its size along `dim`, which may differ between
    ranks (a gather of uneven pieces); returns (key, every rank's size along `dim`).

    The sizes ride in the check's own all_gather (one more int64 in each rank's
    row, left out of the comparison), so a gather that follows needs no exchange
    of its own. Without `check` there is no gather: (key, None), and a caller that
    needs the sizes must know them (from the logical shape) or exchange them. A
    `dim` out of range is left to `validate` to refuse.
    """
    valid = isinstance(dim, int) and -tensor.dim() <= dim < tensor.dim()
    compared = tensor.narrow(dim, 0, 0) if valid else tensor
    length = tensor.size(dim) if valid else -1
    return _agreed(name, compared, group, validate, key_name, check, None, length)


def _agreed(
    name: str,
    tensor: Tensor,
    group: Group,
    validate: Callable[[], int],
    key_name: str,
    check: bool,
    explain: Callable[[], str] | None,
    length: int | None,
) -> tuple[int, list[int] | None]:
    """`agree`'s body; `length` (if not None) travels in the row uncompared, and
    every rank's is returned."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {type(tensor).__name__}")
    if not check:
        return validate(), None
    g = members(group, name)
    if g.size == 1:  # no other rank to disagree with
        return validate(), None if length is None else [length]
    problem, key = None, -1
    try:
        key = validate()
    except (ValueError, TypeError) as err:
        problem = err
    mine = _describe(name, key, tensor, problem is None)
    if length is not None:
        mine = torch.cat([mine, mine.new_tensor([length])])
    rows = [torch.empty_like(mine) for _ in range(g.size)]
    dist.all_gather(rows, mine, group=g.group)
    table = torch.stack(rows).tolist()  # (ranks, 4 + TensorSpec.LENGTH [+ 1])
    lengths = None if length is None else [row.pop() for row in table]
    if problem is not None:
        raise problem
    failed = [g.ranks[r] for r, row in enumerate(table) if not row[0]]
    if failed:
        raise ValueError(f"{name}: rank(s) {failed} rejected their arguments; stopping")
    if any(row != table[0] for row in table):
        if explain is not None:
            raise ValueError(explain())
        calls = "; ".join(
            f"rank {g.ranks[r]}: {_show(row, key_name)}" for r, row in enumerate(table)
        )
        raise ValueError(f"{name}: ranks disagree on shape, dtype or op: {calls}")
    return key, lengths


Entry = tuple[str, tuple[int, ...], str]  # one tensor: name, shape, dtype


def agree_tensors(
    name: str,
    tensors: Sequence[tuple[str, Tensor]],
    group: Group = None,
    *,
    config: object = (),
    validate: Callable[[], object] = no_key,
) -> None:
    """Check this rank's arguments (`validate`), then that every rank of `group`
    holds tensors of the same names, shapes and dtypes, in the same order, and the
    same `config` (compared by repr): what a caller checks before it builds flat
    buffers from a model, whose collectives would otherwise abort (gloo: "Received
    data size doesn't match expected size") or hang or mix data (NCCL).

    One `agree`: the descriptor is a zero-byte tensor of shape (count, elements) in
    the first tensor's dtype, the key a digest of every entry and `config`. Only when
    they differ do the ranks gather their lists (all_gather_object) to name each
    odd rank's first difference; every rank raises the same ValueError. With no
    process group there is no peer to warn: `validate` raises first, then the
    missing group does.
    """
    entries = [(n, tuple(t.shape), _dtype(t.dtype)) for n, t in tensors]
    setting = repr(config)
    if not dist.is_initialized():
        validate()
    digest = zlib.crc32(repr((entries, setting)).encode()) & 0x7FFFFFFF

    def checked() -> int:
        validate()
        return digest

    first = tensors[0][1] if tensors else torch.zeros((), device=runtime.device())
    blank = torch.zeros((), dtype=first.dtype, device=first.device)

    def explain() -> str:
        g = members(group, name)
        lists: list[Any] = [None] * g.size
        dist.all_gather_object(lists, (entries, setting), group=g.group)
        return _differences(name, lists, g.ranks)

    shape = (len(entries), sum(t.numel() for _, t in tensors))
    agree(name, blank.expand(shape), group, validate=checked, explain=explain)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _differences(name: str, lists: list[Any], ranks: list[int]) -> str:
    """Which ranks differ from the most common (lowest rank on a tie), and how."""
    shown = [repr(x) for x in lists]
    usual = max(range(len(lists)), key=lambda r: (shown.count(shown[r]), -r))
    odd = [r for r in range(len(lists)) if shown[r] != shown[usual]]
    told = "; ".join(
        f"rank {ranks[r]}: {_first_difference(lists[r], lists[usual], ranks[usual])}"
        for r in odd
    )
    return (
        f"{name}: rank(s) {[ranks[r] for r in odd]} differ from rank "
        f"{ranks[usual]} ({told}); every rank must build the same model with the "
        "same arguments"
    )


def _first_difference(mine: Any, usual: Any, rank: int) -> str:
    (entries, setting), (base, base_setting) = mine, usual
    if setting != base_setting:
        return f"settings {setting} where rank {rank} has {base_setting}"
    for a, b in zip(entries, base, strict=False):
        if a != b:
            return f"{_entry(a)} where rank {rank} has {_entry(b)}"
    return f"{len(entries)} tensors where rank {rank} has {len(base)}"


def _entry(entry: Entry) -> str:
    n, shape, dtype = entry
    return f"{n} {dtype}{list(shape)}"

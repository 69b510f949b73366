"""Making global tensors: factories, and gt.to_global of a local tensor or a module.

`gt.randn(20, 10, placement=p, sbp=gt.sbp.split(0))` has the same logical values as
`torch.randn(20, 10)` in one process after the same `torch.manual_seed`: every rank
draws the whole tensor and keeps its piece (simple, and memory is not the point of
a course; OneFlow instead offsets each rank's generator).

`gt.to_global(local, p, sbp)` reads `local` as this rank's piece: under split the
pieces are concatenated (any sizes that follow torch.tensor_split), under broadcast
rank 0's values win (like OneFlow), under partial_sum the pieces are summed. One
all_gather of each rank's shape (80 bytes) finds the logical shape and checks the
pieces on every rank before any data moves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse.comm.spec import MAX_DIMS, TensorSpec
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.sbp import (
    Broadcast,
    Signature,
    Split,
    check_grad_fits,
    describe,
    local_piece,
    local_shape,
    signature,
)
from distcourse.global_tensor.tensor import (
    GlobalTensor,
    default_grad_sbp,
    rebox,
    watch_grad,
)


def _factory(
    fn: Any,
    size: tuple,
    placement: Placement,
    sbp: Any,
    dtype: Any,
    requires_grad: bool,
    name: str,
) -> GlobalTensor:
    if len(size) == 1 and isinstance(size[0], list | tuple | torch.Size):
        size = tuple(size[0])
    sig = signature(sbp, placement.ndim, len(size), f"gt.{name}")
    coord = placement.require_member(f"gt.{name}")
    full = fn(size, dtype)
    piece = local_piece(full, sig, placement.hierarchy, coord).to(placement.device)
    out = GlobalTensor(piece, placement, sig, tuple(full.shape), requires_grad)
    if requires_grad:
        watch_grad(out)
    return out


def _torch_factory(
    make: Callable[..., Tensor], name: str
) -> Callable[..., GlobalTensor]:
    """gt.NAME(*size, placement=, sbp=): torch.NAME(*size)'s values, placed; the same
    values for every placement and sbp (each rank keeps its piece of them)."""

    def factory(
        *size: Any,
        placement: Placement,
        sbp: Any,
        dtype: Any = None,
        requires_grad: bool = False,
    ) -> GlobalTensor:
        fn = lambda s, d: make(s, dtype=d)  # noqa: E731
        return _factory(fn, size, placement, sbp, dtype, requires_grad, name)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"torch.{name}(*size)'s values, placed; the same for any sbp."
    return factory


randn = _torch_factory(torch.randn, "randn")
zeros = _torch_factory(torch.zeros, "zeros")
ones = _torch_factory(torch.ones, "ones")


def full(
    size: Any,
    fill_value: float,
    *,
    placement: Placement,
    sbp: Any,
    dtype: Any = None,
    requires_grad: bool = False,
) -> GlobalTensor:
    fn = lambda s, d: torch.full(s, fill_value, dtype=d)  # noqa: E731
    return _factory(fn, (tuple(size),), placement, sbp, dtype, requires_grad, "full")


def _logical(x: Tensor, pl: Placement, sig: Signature, what: str) -> tuple[int, ...]:
    """The logical shape of the pieces, from one all_gather of every rank's shape;
    ValueError on every rank if they do not fit `sig`."""
    if x.dim() > MAX_DIMS:
        raise ValueError(f"{what}: at most {MAX_DIMS} dims")
    row = TensorSpec.of(x).encode()
    mine = torch.tensor(row, dtype=torch.int64, device=x.device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(pl.flat))]
    dist.all_gather(rows, mine, group=pl.flat)
    specs = [TensorSpec.decode(r) for r in torch.stack(rows).tolist()]
    by_rank = {
        dist.get_global_rank(pl.flat, i) if pl.flat is not dist.group.WORLD else i: (
            spec.shape  # type: ignore[union-attr]
        )
        for i, spec in enumerate(specs)
    }
    table = {
        tuple(c.tolist()): by_rank[int(pl.grid[tuple(c)])]
        for c in torch.cartesian_prod(*[torch.arange(n) for n in pl.hierarchy]).reshape(
            -1, pl.ndim
        )
    }
    shape = list(table[(0,) * pl.ndim])
    nd = len(shape)
    for d in range(nd):  # sum the sizes along d over the mesh dims that split d
        splits = [k for k, s in enumerate(sig) if s == Split(d)]
        others = [k for k in range(pl.ndim) if k not in splits]
        if splits:
            rows = [r for c, r in table.items() if all(c[k] == 0 for k in others)]
            shape[d] = sum(r[d] for r in rows if len(r) == nd)
    for c, r in table.items():
        want = local_shape(shape, sig, pl.hierarchy, c)
        if tuple(r) != tuple(want):
            got = list(table.values())
            raise ValueError(
                f"{what}: the pieces' shapes {got} (by mesh coordinate) do not make "
                f"one tensor under {describe(sig)}: split pieces must follow "
                "torch.tensor_split, other dims must match"
            )
    return tuple(shape)


class FromLocal(torch.autograd.Function):
    """A local piece made global; the gradient comes back as the piece of the
    global gradient boxed into `grad` (None: default_grad_sbp(sig))."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, pl: Placement, sig: Signature, grad: Signature | None
    ) -> GlobalTensor:
        ctx.sig = default_grad_sbp(sig) if grad is None else grad
        shape = _logical(x, pl, sig, "gt.to_global")
        if grad is not None:  # every rank decides alike, from the shapes
            check_grad_fits(shape, sig, grad, pl.hierarchy, "gt.to_global")
        x = x.detach().clone(memory_format=torch.contiguous_format)
        for k, s in enumerate(sig):  # broadcast: coordinate 0's values win
            if isinstance(s, Broadcast) and pl.hierarchy[k] > 1:
                line = pl.grid.movedim(k, 0)[
                    (slice(None), *pl.coord[:k], *pl.coord[k + 1 :])
                ]
                dist.broadcast(x, src=int(line[0]), group=pl.groups[k])
        return GlobalTensor(x, pl, sig, shape)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple:
        return rebox(grad, ctx.sig).local_tensor, None, None, None


def to_global(x: Any, placement: Placement, sbp: Any, *, grad_sbp: Any = None) -> Any:
    """A local tensor as this rank's piece of a global one, or a module with every
    parameter and buffer converted so (returned, changed in place). `grad_sbp`
    (tensors only, as OneFlow's): the SBP the global gradient is boxed into before
    this rank's piece of it becomes the local tensor's gradient (DTensor's
    `from_local(..., grad_placements=)`)."""
    if isinstance(x, nn.Module):
        if grad_sbp is not None:
            raise ValueError("gt.to_global: grad_sbp applies to tensors, not modules")
        return _module(x, placement, sbp)
    if isinstance(x, GlobalTensor):
        return x.to_global(placement, sbp, grad_sbp=grad_sbp)
    if not isinstance(x, Tensor):
        raise TypeError(f"gt.to_global: expected a Tensor or a Module, got {type(x)}")
    sig = signature(sbp, placement.ndim, x.dim(), "gt.to_global")
    grad = (
        None
        if grad_sbp is None
        else signature(grad_sbp, placement.ndim, x.dim(), "grad_sbp")
    )
    placement.require_member("gt.to_global")
    return FromLocal.apply(x.to(placement.device), placement, sig, grad)


def _module(module: nn.Module, placement: Placement, sbp: Any) -> nn.Module:
    for sub in module.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            with torch.no_grad():
                value = to_global(p.detach(), placement, sbp)
            new = nn.Parameter(value, requires_grad=p.requires_grad)
            if p.requires_grad:
                watch_grad(new)
            sub.register_parameter(name, new)
        for name, b in list(sub.named_buffers(recurse=False)):
            keep = name not in sub._non_persistent_buffers_set
            sub.register_buffer(name, to_global(b, placement, sbp), persistent=keep)
    return module

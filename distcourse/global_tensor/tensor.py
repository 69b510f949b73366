"""GlobalTensor: one logical tensor whose pieces live on the ranks of a placement.

A wrapper tensor subclass, as DTensor is: the wrapper has the logical shape and no
storage; each rank's piece is `local_tensor`. Autograd runs on the wrappers, above
`__torch_dispatch__`, which receives every aten op of the forward and of the
backward and hands it to dispatch.run. So nn modules, torch.nn.functional,
autograd and torch.optim run unchanged.

The conversions a user calls (`to_global`, `to_local`, `full_tensor`, and
gt.to_global of a local tensor) are autograd Functions: the gradient goes back
through the reverse boxing, into the signature of the input, with a partial sum
replaced by broadcast (a P tensor's gradient is the same for every piece). Pass
`grad_sbp=` to choose it (chapter 7).

A leaf that requires grad (a factory's `requires_grad=True`, `x.requires_grad_()`,
`nn.Parameter(x)`) has its gradient boxed into its own signature before it
accumulates (`watch_grad`): a broadcast parameter's partial gradient goes P -> B,
which is data parallelism's all_reduce. `backward()` checks its arguments on every
rank before any collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from distcourse import emulate
from distcourse.global_tensor import debug, dispatch
from distcourse.global_tensor.boxing import box
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.sbp import (
    Broadcast,
    PartialSum,
    Signature,
    check_grad_fits,
    describe,
    signature,
)


def default_grad_sbp(sig: Signature) -> Signature:
    """The signature a gradient leaves with when no grad_sbp is given: the tensor's
    own, with P replaced by B (a `.grad` must be whole where its tensor is not
    split). Not the signature a gradient arrives with (duality.arrives_as)."""
    return tuple(Broadcast() if isinstance(s, PartialSum) else s for s in sig)


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


# Moving to other ranks is global_tensor.move, which builds on this class: it installs
# itself here when the package is imported, as the op rules fill dispatch.RULES.
mover: Callable[..., GlobalTensor] | None = None


class GlobalTensor(Tensor):
    """A logical tensor: `placement`, `sbp` (a tuple, one per mesh dimension),
    `shape` (logical) and this rank's piece."""

    _local: Tensor
    _placement: Placement
    _sbp: Signature

    @staticmethod
    def __new__(
        cls,
        local: Tensor,
        placement: Placement,
        sbp: Signature,
        shape: tuple[int, ...],
        requires_grad: bool = False,
    ) -> GlobalTensor:
        shape = tuple(shape)
        out = Tensor._make_wrapper_subclass(
            cls,
            shape,
            strides=_strides(shape),
            dtype=local.dtype,
            device=emulate.wrapper_device(local.device),  # local.device elsewhere
            requires_grad=requires_grad,
        )
        out._local = local.detach() if local.requires_grad else local
        out._placement, out._sbp = placement, tuple(sbp)
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        return dispatch.run(cls, func, args, kwargs or {})

    # ----------------------------------------------------------- metadata ----

    @property
    def placement(self) -> Placement:
        return self._placement

    @property
    def sbp(self) -> Signature:
        """One SBP per mesh dimension (a tuple even on 1-D placements, as OneFlow)."""
        return self._sbp

    @property
    def local_tensor(self) -> Tensor:
        """This rank's piece, outside autograd (use to_local() inside a model)."""
        return self._local

    def requires_grad_(self, requires_grad: bool = True) -> GlobalTensor:
        """As torch's; a leaf's gradient is then boxed into this tensor's signature
        (nn.Parameter(x) comes through here too)."""
        super().requires_grad_(requires_grad)
        if requires_grad and self.is_leaf:
            watch_grad(self)
        return self

    def backward(
        self,
        gradient: Any = None,
        retain_graph: Any = None,
        create_graph: bool = False,
        inputs: Any = None,
    ) -> None:
        """torch's backward, with its arguments checked first (ValueError on every
        rank, before any collective): a non-scalar needs `gradient`, a global tensor
        of the same logical shape and placement (any signature)."""
        shape = list(self.shape)
        if gradient is None and self.numel() != 1:
            raise ValueError(
                f"backward() on a global tensor of shape {shape} needs gradient=, a "
                "global tensor of the same shape and placement; or reduce it to a "
                "scalar first (.sum(), .mean())"
            )
        if gradient is not None:
            if not isinstance(gradient, GlobalTensor):
                raise ValueError(
                    f"backward(gradient=...) of a global tensor got a plain "
                    f"{type(gradient).__name__} of shape {list(gradient.shape)}: its "
                    "SBP would be unknown; make it global with gt.to_global(g, "
                    "placement, sbp)"
                )
            if gradient.placement != self._placement or list(gradient.shape) != shape:
                raise ValueError(
                    f"backward(gradient=...): gradient {list(gradient.shape)} on "
                    f"{gradient.placement} for a tensor {shape} on {self._placement}"
                )
        super().backward(gradient, retain_graph, create_graph, inputs)

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (
            f"GlobalTensor(shape={list(self.shape)}, sbp={describe(self._sbp)}, "
            f"{self._placement}, local={self._local}{grad})"
        )

    # -------------------------------------------------------- conversions ----

    def to_local(self, *, grad_sbp: Any = None) -> Tensor:
        """This rank's piece (empty outside the placement); its gradient becomes a
        global tensor with this tensor's signature (P replaced by B) or `grad_sbp`."""
        grad = _grad_signature(self, grad_sbp, self._sbp)
        pl = self._placement
        if pl.coord is None:  # outside the placement: empty, as OneFlow's
            return ToLocal.apply(self, grad)
        check_grad_fits(self.shape, self._sbp, grad, pl.hierarchy, "to_local")
        return ToLocal.apply(self, grad)

    def to_global(
        self,
        placement: Placement | None = None,
        sbp: Any = None,
        *,
        grad_sbp: Any = None,
    ) -> GlobalTensor:
        """The same logical tensor under another signature (boxing, a collective
        on every rank of the placement). To another placement: a move, which every
        rank of both placements calls (see global_tensor.move)."""
        if placement is not None and placement != self._placement:
            if mover is None:
                raise RuntimeError("moving placements: import distcourse.global_tensor")
            return mover(self, placement, sbp, grad_sbp)
        what = "to_global"
        target = (
            self._sbp
            if sbp is None
            else signature(sbp, self._placement.ndim, self.dim(), what)
        )
        grad = _grad_signature(self, grad_sbp, self._sbp)
        self._placement.require_member(what)
        return Redistribute.apply(self, target, grad)

    def full_tensor(self) -> Tensor:
        """The logical tensor, whole, on every rank (a collective: call it on all)."""
        b = tuple(Broadcast() for _ in self._sbp)
        return self.to_global(sbp=b).to_local()


def _grad_signature(x: GlobalTensor, grad_sbp: Any, sig: Signature) -> Signature:
    if grad_sbp is None:
        return default_grad_sbp(sig)
    return signature(grad_sbp, x.placement.ndim, x.dim(), "grad_sbp")


def watch_grad(t: GlobalTensor) -> None:
    """Box t's gradient into t's signature (P -> B) before it accumulates: for a
    broadcast parameter this is data parallelism's gradient all_reduce. Once per t."""
    if getattr(t, "_watched", False):
        return
    t._watched = True
    target = default_grad_sbp(t.sbp)

    def hook(g: Tensor) -> Tensor:
        if not isinstance(g, GlobalTensor) or g.sbp == target:
            return g
        if debug.active():
            debug.record(
                f"  gradient into a leaf: {describe(g.sbp)} -> {describe(target)}"
            )
        return rebox(g, target)

    t.register_hook(hook)


def as_global(grad: Any, like: GlobalTensor, what: str) -> GlobalTensor:
    """A gradient, which should be global, or TypeError."""
    if not isinstance(grad, GlobalTensor):
        raise TypeError(f"{what}: expected a global gradient, got {type(grad)}")
    return grad


def rebox(x: GlobalTensor, sig: Signature) -> GlobalTensor:
    """x under `sig`, outside autograd (used by backwards and hooks)."""
    if x.sbp == sig:
        return x
    local = box(x.local_tensor, x.placement, x.sbp, sig, tuple(x.shape))
    return GlobalTensor(local, x.placement, sig, tuple(x.shape))


class Redistribute(torch.autograd.Function):
    """Boxing with a backward: the gradient is boxed back to `grad` (a signature)."""

    @staticmethod
    def forward(ctx: Any, x: GlobalTensor, sig: Signature, grad: Signature) -> Any:
        ctx.grad = grad
        return rebox(x, sig)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return rebox(as_global(g, g, "to_global backward"), ctx.grad), None, None


class ToLocal(torch.autograd.Function):
    """x.to_local(): the gradient of the piece, wrapped with signature `grad`."""

    @staticmethod
    def forward(ctx: Any, x: GlobalTensor, grad: Signature) -> Tensor:
        ctx.placement, ctx.shape, ctx.grad = x.placement, tuple(x.shape), grad
        local = x.local_tensor
        return local.view_as(local)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple:
        # each rank's g is read as its piece of the gradient under `grad`
        return GlobalTensor(g, ctx.placement, ctx.grad, ctx.shape), None

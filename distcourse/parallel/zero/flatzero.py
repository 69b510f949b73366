"""ZeRO stages 1 and 2 as the paper and DeepSpeed run them: a flat buffer, even pieces.

`FlatZero(module, optimizer_class, stage=1 or 2, ...)` wraps a module and builds its
optimizer, `.optimizer`: a plain `optimizer_class` whose parameters are this rank's
even pieces of the flat buffer (`flat.FlatLayout`), views into the very memory the
module's parameters now live in. Its state (AdamW: two moments per element) is 1/N
of the whole, ZeRO's P_os (paper §5.1).

A step moves what DP's all-reduce moves, 2Ψ (N-1)/N bytes per rank (paper §7.2.1):
a ring all-reduce is a reduce-scatter then an all-gather, and ZeRO runs the two
halves apart. The reduce-scatter leaves each rank the averaged gradient of its
piece, the rank steps its piece, and `optimizer.step()` ends with the all-gather of
the updated pieces straight into the flat buffer, so every rank has every parameter
again. torch's `ZeroRedundancyOptimizer` (and ours in `optimizer.py`, its drop-in)
instead runs on DDP's all-reduce and broadcasts the parameters after: 3Ψ.

- Stage 1 (P_os): gradients accumulate into one full flat gradient buffer (the
  module's `.grad` are views of it); when backward ends, each region is
  reduce-scattered into this rank's piece.
- Stage 2 (P_os+g, §5.2): a hook takes each gradient as backward produces it,
  copies it into its region's bucket and drops it; a full bucket is reduce-scattered
  at once and freed. At most one bucket of full-size gradients exists at a time,
  never the whole gradient. (Synchronous here: `torchcompat.reduce_scatter_tensor`
  blocks; an async one would hold a second bucket while the first travels.)

`meter.peak` is the most full-size gradient bytes alive during the last backward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer

from distcourse import torchcompat
from distcourse.comm.agree import Group, agree_tensors
from distcourse.parallel.zero.flat import FlatLayout
from distcourse.parallel.zero.meter import GradientMeter


class FlatZero(nn.Module):
    """`module` under ZeRO `stage` 1 or 2, with `.optimizer` over this rank's pieces.

    `optimizer_class` (any torch optimizer class) is built with `defaults` over this
    rank's pieces, one tensor per bucket region; call `.optimizer.zero_grad()` and
    `.optimizer.step()` as usual. `bucket_cap_mb`: a bucket closes once it holds that
    many MiB. `group`: the ranks sharing the model (None: all). The ranks first agree
    on the module's parameter and buffer names, shapes and dtypes and on every
    argument (another model on one rank: a ValueError on every rank naming it), then
    take rank 0's values, as DDP does. Every parameter must get a gradient in every
    backward. Several backward passes before a step accumulate (micro-batches):
    each reduce-scatters its gradients and the pieces' `.grad` sum them, unless
    stage 1 is told `set_requires_gradient_sync(False)` for all but the last. After
    backward the averaged gradient is in the pieces' `.grad` (`self.pieces`), not
    the module's: stage 1 zeroes its flat gradient for the next backward, stage 2
    has dropped each one. The optimizer's options apply to every piece alike (no
    per-parameter groups: a piece may hold parts of several parameters).
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer_class: type[Optimizer],
        stage: int = 2,
        bucket_cap_mb: float = 25.0,
        group: Group = None,
        **defaults: Any,
    ) -> None:
        super().__init__()
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        cls = getattr(optimizer_class, "__qualname__", repr(optimizer_class))
        agree_tensors(  # before any collective: a wrong model is named, not aborted
            "FlatZero",
            [*module.named_parameters(), *module.named_buffers()],
            group,
            config=dict(
                stage=stage,
                bucket_cap_mb=bucket_cap_mb,
                optimizer_class=cls,
                **dict(sorted(defaults.items())),  # the same order on every rank
            ),
            validate=lambda: check_flat(
                optimizer_class, stage, bucket_cap_mb, [p for _, p in named]
            ),
        )
        self.module = module
        self.group = group
        self.stage = stage
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.layout = layout = FlatLayout(
            self.params, self.world, int(bucket_cap_mb * 2**20)
        )
        with torch.no_grad():
            self.flat = layout.flatten([p.detach() for p in self.params])
            self._copy_from_rank0(module)
            for i, p in enumerate(self.params):
                p.data = layout.view(self.flat, i)  # the module now lives in `flat`
        rank, world = self.rank, self.world
        self.pieces = [self.flat[r.piece(rank, world)] for r in layout.regions]
        self.optimizer = optimizer_class(self.pieces, **defaults)
        self.optimizer.register_step_post_hook(self.gather_pieces)
        self.grad_flat: Tensor | None = None
        if stage == 1:  # the full flat gradient; each .grad a view of it
            self.grad_flat = torch.zeros_like(self.flat)
            for i, p in enumerate(self.params):
                p.grad = layout.view(self.grad_flat, i)
        self.buckets: list[Tensor | None] = [None] * len(layout.regions)
        self.ready = [False] * len(self.params)
        self.next = 0  # regions are reduced in index order, the same on every rank
        self.in_backward = False
        self.sync = True
        self.meter = GradientMeter(
            self.params, extra=self.gradient_buffers, hooks=False
        )
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(self._hook(i))

    def set_requires_gradient_sync(self, requires: bool) -> None:
        """Stage 1: False lets the next backward passes sum their gradients in the
        full flat buffer without reducing them (FSDP2's name, DDP's `no_sync`); the
        first backward after True reduce-scatters the sum once. Stage 2 holds no
        full gradients to sum in: each backward must reduce-scatter its own."""
        if self.stage == 2 and not requires:
            raise ValueError(
                "FlatZero: stage 2 keeps only this rank's piece of the gradients, "
                "so every backward reduce-scatters; use stage 1 to accumulate "
                "without sync"
            )
        self.sync = bool(requires)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward; whatever a failed backward left is forgotten."""
        self.in_backward = False
        self.buckets = [None] * len(self.buckets)
        return self.module(*args, **kwargs)

    def gradient_buffers(self) -> Sequence[Tensor]:
        """The full-size gradient buffers this wrapper holds now."""
        if self.grad_flat is not None:
            return [self.grad_flat]
        return [b for b in self.buckets if b is not None]

    # ------------------------------------------------------------- backward ----

    def _hook(self, index: int) -> Callable[[Tensor], None]:
        def on_gradient(param: Tensor) -> None:
            if not self.in_backward:
                self._start_backward()
            if self.stage == 1:
                self._keep(index, param)
            else:
                self._bucket(index, param)
            self.ready[index] = True
            if self.stage == 2:
                self.reduce_full_buckets(at_end=False)

        return on_gradient

    def _start_backward(self) -> None:
        """The first gradient of a backward: count afresh, queue `finish` at its end."""
        self.in_backward = True
        self.ready = [False] * len(self.params)
        self.next = 0
        self.meter.reset()
        torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def _keep(self, index: int, param: Tensor) -> None:
        """Stage 1: the gradient stays whole, in the flat gradient buffer."""
        assert self.grad_flat is not None and param.grad is not None
        view = self.layout.view(self.grad_flat, index)
        if param.grad.data_ptr() != view.data_ptr():  # .grad was set to None
            view.add_(param.grad)
        self.meter.sample()
        param.grad = view

    def _bucket(self, index: int, param: Tensor) -> None:
        """Stage 2: copy the gradient into its region's bucket, then drop it."""
        assert param.grad is not None
        k, at = self.layout.where[index]
        region = self.layout.regions[k]
        if self.buckets[k] is None:  # the region's first gradient: a new bucket
            self.buckets[k] = self.flat.new_zeros(region.size)
        bucket = self.buckets[k]
        assert bucket is not None
        start = at - region.start
        bucket[start : start + param.numel()].copy_(param.grad.reshape(-1))
        self.meter.sample()  # the peak: this bucket and this gradient both alive
        param.grad = None

    def reduce_full_buckets(self, at_end: bool) -> None:
        """Stage 2: reduce-scatter every full bucket, in region order, and free it.

        Called after each gradient (`at_end` False) and when backward ends (True).
        """
        regions = self.layout.regions
        while self.next < len(regions) and all(
            self.ready[i] for i in regions[self.next].params
        ):
            bucket = self.buckets[self.next]
            assert bucket is not None
            self.reduce_region(self.next, bucket)
            self.buckets[self.next] = None  # the full-size gradient is gone
            self.next += 1

    def reduce_region(self, k: int, full: Tensor) -> None:
        """Region `k`'s gradients summed over the ranks; this rank's piece, averaged,
        becomes the gradient of its optimizer tensor."""
        piece = self.flat.new_empty(self.layout.regions[k].size // self.world)
        torchcompat.reduce_scatter_tensor(piece, full, self.group)
        grad = self.pieces[k].grad
        if grad is None:  # the step's first backward
            self.pieces[k].grad = piece.div_(self.world)
        else:  # another micro-batch: gradients accumulate, as .grad does
            grad.add_(piece.div_(self.world))

    def finish(self) -> None:
        """The end of backward (queued by its first gradient): check that every
        parameter got a gradient, then reduce what is left (stage 1: everything)."""
        if not self.in_backward:
            return
        self.in_backward = False
        missing = [n for n, ok in zip(self.names, self.ready, strict=True) if not ok]
        if missing:
            self.buckets = [None] * len(self.buckets)
            raise RuntimeError(
                f"FlatZero: parameters without a gradient in this backward: "
                f"{', '.join(missing)}. Every parameter must take part in the loss."
            )
        if self.grad_flat is None:
            self.reduce_full_buckets(at_end=True)
            return
        if not self.sync:  # stage 1 without sync: the full gradients accumulate
            return
        for region in self.layout.regions:
            self.reduce_region(region.index, self.grad_flat[region.span()])
        self.grad_flat.zero_()  # the next backward accumulates from zero

    # ----------------------------------------------------------------- step ----

    def gather_pieces(self, *_: object) -> None:
        """After `optimizer.step()`: every rank's updated pieces into `flat`."""
        works = []
        with torch.no_grad():
            for region, piece in zip(self.layout.regions, self.pieces, strict=True):
                out = self.flat[region.span()]
                works.append(
                    torchcompat.all_gather_tensor(
                        out, piece.clone(), self.group, async_op=True
                    )
                )
            for work in works:
                work.wait()

    def _copy_from_rank0(self, module: nn.Module) -> None:
        """Rank 0's flat parameters, other parameters and buffers, on every rank."""
        src = dist.get_global_rank(self.group or dist.group.WORLD, 0)
        trainable = {id(p) for p in self.params}
        others = [p for p in module.parameters() if id(p) not in trainable]
        for tensor in [self.flat, *others, *module.buffers()]:
            dist.broadcast(tensor, src, group=self.group)


def check_flat(
    optimizer_class: Any, stage: Any, bucket_cap_mb: Any, params: list[Tensor]
) -> None:
    """TypeError or ValueError for arguments `FlatZero` cannot run on (this rank)."""
    if not (
        isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)
    ):
        raise TypeError(
            "FlatZero: optimizer_class must be a torch.optim.Optimizer class such as "
            f"torch.optim.AdamW, got {optimizer_class!r}"
        )
    if stage not in (1, 2):
        raise ValueError(
            f"FlatZero: stage must be 1 or 2, got {stage!r} (stage 3 is parallel.fsdp)"
        )
    if not isinstance(bucket_cap_mb, int | float) or not bucket_cap_mb > 0:
        raise ValueError(f"FlatZero: bucket_cap_mb must be > 0, got {bucket_cap_mb!r}")
    if not params:
        raise ValueError("FlatZero: the module has no parameter that requires grad")
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) != 1 or not params[0].is_floating_point():
        raise ValueError(
            "FlatZero: every parameter must have one floating dtype and one device "
            f"(one flat buffer holds them), got {sorted(map(str, kinds))}"
        )

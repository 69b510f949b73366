"""Data parallelism: every rank holds the whole model and trains on its own data.

The chapter's steps, simplest first: `average_gradients` all-reduces each gradient
after backward (synchronous SGD by hand), `partition` gives each rank its share of the
data, and `DDP` overlaps the all-reduce with backward by sending gradients in buckets
as soon as they are ready, as torch's DistributedDataParallel does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, Subset

from distcourse import runtime
from distcourse.clock import DeviceTimer, Stamp
from distcourse.comm.agree import Group
from distcourse.parallel import compat
from distcourse.parallel.buckets import Bucket, CommHook, assign_buckets
from distcourse.parallel.replicas import (
    check_same_shapes,
    check_same_values,
    copy_from_rank0,
)
from distcourse.trace import Event


def average_gradients(model: nn.Module, group: Group = None) -> None:
    """Replace every gradient by its average over the ranks: synchronous SGD by hand.

    One blocking all-reduce per parameter after backward, the baseline DDP improves
    on. A parameter without a gradient on this rank takes part with zeros, so every
    rank makes the same calls (none waits forever), and receives the average.
    """
    runtime.require_initialized()
    world = dist.get_world_size(group)
    for param in model.parameters():
        if not param.requires_grad:
            continue
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM, group=group)
        param.grad /= world


def partition(
    dataset: Dataset,
    rank: int | None = None,
    world_size: int | None = None,
    shuffle_seed: int | None = None,
) -> Subset:
    """This rank's share of `dataset`: every world_size-th sample, starting at `rank`.

    Strided shares: N ranks with batch b see, step by step, the samples of one
    process with batch N*b. The last len % world_size are dropped so all ranks take
    as many steps (one that ran out early would leave the others waiting in
    all-reduce). `shuffle_seed` (the same on all ranks; change it every epoch)
    shuffles first; shares stay disjoint. Rank and world size default to this group's.
    """
    if rank is None or world_size is None:
        info = runtime.require_initialized()
        rank = info.rank if rank is None else rank
        world_size = info.world_size if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got {rank=} {world_size=}")
    n = len(dataset)  # type: ignore[arg-type]
    if n < world_size:
        raise ValueError(f"{n} samples cannot be shared among {world_size} ranks")
    if shuffle_seed is None:
        order = torch.arange(n)
    else:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(shuffle_seed))
    used = n - n % world_size
    return Subset(dataset, order[rank:used:world_size].tolist())


class DDP(nn.Module):
    """Distributed data parallel, from scratch: equal replicas, averaged gradients.

    Construction checks that all ranks wrap the same parameter shapes, then copies
    rank 0's parameters and buffers. In backward, a hook on each parameter copies its
    gradient into a bucket; a full bucket is all-reduced at once (async_op=True) while
    backward computes the earlier layers; a callback at the end of backward waits for
    the buckets and writes the averages into .grad, so `optimizer.step()` follows.

    Takes torch's DistributedDataParallel arguments, in torch's order and with their
    meaning (`parallel.compat` says which are implemented, accepted or refused), so a
    torch program runs with this DDP by changing its import. `bucket_cap_mb`:
    bucket size in MiB (default 25). `find_unused_parameters`: a parameter without a
    gradient in a backward is sent as zeros (and keeps grad None if no rank had one);
    without it, such a parameter raises a RuntimeError naming it.
    `gradient_as_bucket_view`: each .grad becomes a view into its bucket, saving one
    copy of the gradients.

    Ours alone: `check_equal` raises ValueError if the ranks' initial values differ;
    `group` is another name for `process_group`. `timeline` holds the last step's
    Events: forward, backward (until the last gradient arrived), one per bucket
    all-reduce (launch to completion), and the wait after the last gradient
    (launching the last buckets, waiting for all of them).
    """

    def __init__(  # torch's signature, argument for argument
        self,
        module: nn.Module,
        device_ids: list[int | torch.device] | None = None,
        output_device: int | torch.device | None = None,
        dim: int = 0,
        broadcast_buffers: bool | None = None,
        init_sync: bool = True,
        process_group: Group = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        delay_all_reduce_named_params: Any = None,
        param_to_hook_all_reduce: Any = None,
        mixed_precision: Any = None,
        device_mesh: Any = None,
        skip_all_reduce_unused_params: bool = False,
        bucket_cap_mb_list: list[int] | None = None,
        batched_grad_copy: bool = False,
        forward_sync_buffers: bool | None = None,
        *,
        check_equal: bool = False,
        group: Group = None,
    ) -> None:
        super().__init__()
        args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.options = compat.ddp_options(**args)
        runtime.require_initialized()
        self.module = module
        self.group = group = self.options.group
        self.process_group = dist.group.WORLD if group is None else group  # as torch's
        self.device_ids = None if self.options.device is None else [self.options.device]
        self.world_size = dist.get_world_size(group)
        self.find_unused_parameters = self.options.find_unused_parameters
        self.broadcast_buffers = self.options.forward_sync_buffers
        self.gradient_as_bucket_view = self.options.gradient_as_bucket_view
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if self.options.init_sync:
            check_same_shapes(named, group)
            if check_equal:
                check_same_values(named, group)
            copy_from_rank0(module, group, buffers=self.options.init_sync_buffers)
        self.names = {id(p): n for n, p in named}
        params = [p for _, p in named]
        groups = assign_buckets(params, int(self.options.bucket_cap_mb * 2**20))
        # The timeline's stamps: device time on a GPU (clock.DeviceTimer)
        self.clock = DeviceTimer(params[0].device if params else None)
        self.buckets = [
            Bucket(i, [params[j] for j in indices], len(groups), self.clock)
            for i, indices in enumerate(groups)
        ]
        for bucket in self.buckets:
            for slot, param in enumerate(bucket.params):
                param.register_post_accumulate_grad_hook(self._hook(bucket, slot))
        self.timeline: list[Event] = []
        self._sync = True  # False inside no_sync()
        self._comm_hook: CommHook | None = None  # (state, hook) once registered
        self._backward_ran = False
        self._in_backward = False
        self._next_bucket = 0  # buckets launch in index order, the same on every rank
        self._backward_start: Stamp | None = None
        self._last_grad: Stamp | None = None  # the last gradient of this backward

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        start = self.clock.stamp()
        self.timeline = []
        if self.broadcast_buffers and torch.is_grad_enabled():
            with torch.no_grad():
                for buf in self.module.buffers():
                    dist.broadcast(buf, group=self.group, group_src=0)
        if self.options.device is not None:  # device_ids: inputs go to the module
            args, kwargs = compat.to_device((args, kwargs), self.options.device)
        out = self.module(*args, **kwargs)
        end = self.clock.stamp()
        self.timeline.append(Event("forward", *map(self.clock.time, (start, end))))
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(self._mark_backward_start)  # first thing backward does
        return out

    def _mark_backward_start(self, grad: torch.Tensor) -> None:
        self._backward_start = self.clock.stamp()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes in here accumulate gradients locally, without communication.

        The next backward outside all-reduces the accumulated sums: k micro-batches
        then cost one round of communication instead of k.
        """
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def register_comm_hook(self, state: object, hook: Any) -> None:
        """Send each bucket with `hook(state, bucket)` instead of the all-reduce.

        torch's contract: `bucket` has GradBucket's methods; its buffer is NOT
        divided by the world size (the hook averages, as `allreduce_hook` does); the
        hook returns a Future holding the bucket's new flat tensor, which goes into
        .grad. Once only, before the first backward: else RuntimeError.
        """
        compat.check_comm_hook(hook, self._comm_hook is not None, self._backward_ran)
        self._comm_hook = (state, hook)

    def _copy_in(self, grad: torch.Tensor, out: torch.Tensor) -> None:
        # Divide as we copy (one pass), as torch's DDP; a comm hook averages itself.
        if self._comm_hook is None:
            torch.div(grad, self.world_size, out=out)
        else:
            out.copy_(grad)

    def _hook(self, bucket: Bucket, slot: int) -> Any:
        def on_grad_ready(param: torch.Tensor) -> None:
            if not self._sync:
                return  # no_sync(): the gradient just accumulates in param.grad
            if not self._in_backward:
                self._start_backward()
            self._last_grad = self.clock.stamp()  # backward computed up to here
            self._copy_in(param.grad, bucket.view(slot))
            if self.gradient_as_bucket_view:
                param.grad = bucket.view(slot)  # the gradient now lives in the bucket
            bucket.ready[slot] = True
            self._launch_full_buckets()

        return on_grad_ready

    def _start_backward(self) -> None:
        """First gradient of a backward: reset buckets, queue finish() for its end."""
        self._in_backward = self._backward_ran = True
        self._next_bucket = 0
        for bucket in self.buckets:
            bucket.reset()
        if self._backward_start is None:  # forward's output was not a tensor
            self._backward_start = self.clock.stamp()
        torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def _launch_full_buckets(self) -> None:
        # Strictly in order: every rank must issue the same all-reduces in the same
        # order, or rank 0's bucket 1 would be summed with rank 1's bucket 2.
        while (
            self._next_bucket < len(self.buckets)
            and self.buckets[self._next_bucket].is_full()
        ):
            self.buckets[self._next_bucket].launch(self.group, self._comm_hook)
            self._next_bucket += 1

    def finish(self) -> None:
        """Wait for every bucket's all-reduce and write the averages into .grad.

        Runs by itself at the end of each synchronised backward (the first gradient
        hook queues it on autograd's engine); calling it again does nothing.
        """
        if not self._in_backward:
            return
        self._in_backward = False
        used_anywhere = self._handle_unused()
        for bucket in self.buckets:
            done = self.clock.time(bucket.wait())
            self.timeline.append(
                Event(f"all_reduce {bucket.index}", bucket.launched_at, done)
            )
            for slot, param in enumerate(bucket.params):
                view = bucket.view(slot)
                if param.grad is not None:
                    if param.grad.data_ptr() != view.data_ptr():
                        param.grad.copy_(view)
                elif used_anywhere is None or used_anywhere[id(param)]:
                    param.grad = view if self.gradient_as_bucket_view else view.clone()
        # Backward computes until its last gradient arrives; what follows is sending
        # the last buckets and waiting for them.
        last = self._last_grad or self.clock.stamp()
        end, now = self.clock.time(last), self.clock.time(self.clock.stamp())
        start = self.clock.time(self._backward_start or last)
        self.timeline.append(Event("backward", start, end))
        self.timeline.append(Event("wait", end, now))
        self._backward_start = None

    def _handle_unused(self) -> dict[int, bool] | None:
        """Deal with parameters that got no gradient in this backward.

        Without find_unused_parameters: RuntimeError naming them (all ranks agree,
        since they run the same model). With it: they contribute the gradient they
        have (accumulated under no_sync) or zeros; returns, per parameter, whether any
        rank had a gradient, so that parameters unused everywhere keep grad None.
        """
        missing = [
            (bucket, slot)
            for bucket in self.buckets
            for slot, ready in enumerate(bucket.ready)
            if not ready
        ]
        if not self.find_unused_parameters:
            if missing:
                names = ", ".join(self.names[id(b.params[s])] for b, s in missing)
                raise RuntimeError(
                    f"DDP: parameters without a gradient in this backward: {names}. "
                    "Use them in forward, or pass find_unused_parameters=True to DDP."
                )
            return None
        for bucket, slot in missing:
            grad = bucket.params[slot].grad
            if grad is None:
                bucket.view(slot).zero_()
            else:
                self._copy_in(grad, bucket.view(slot))
            bucket.ready[slot] = True
        self._launch_full_buckets()  # first: every rank must launch them before ...
        params = [p for b in self.buckets for p in b.params]
        has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
        has_grad = has_grad.to(runtime.device())  # NCCL takes only GPU tensors
        dist.all_reduce(has_grad, group=self.group)  # ... this, in the same order
        return {id(p): bool(n) for p, n in zip(params, has_grad.tolist(), strict=True)}

"""Peak gradient bytes: the most gradient memory alive at once during backward.

ZeRO-2's saving is a peak, not an end state: the gradients of a step never exist
whole if each bucket is reduce-scattered and freed as soon as it is full (ZeRO paper
§5.2). `GradientMeter` samples, each time a parameter's gradient has been
accumulated, the bytes of every gradient tensor then alive: the parameters' `.grad`
and the buffers a strategy names (its buckets). Each storage is counted once, so
gradients that are views into one flat buffer count as that buffer. It counts
what the strategy holds, not what autograd holds inside a node, nor a temporary a
collective makes (`ShardedDDP`'s padded row): `torch.cuda.max_memory_allocated`
sees every allocation on a GPU, activations included; CPU ranks have no such count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from torch import Tensor


class GradientMeter:
    """The most gradient bytes alive at any sample since the last `reset()`.

    `params`: the parameters whose `.grad` count; `extra`: a function giving the
    other gradient buffers alive now (a strategy's buckets). With `hooks`, a
    post-accumulate-grad hook on each parameter samples: register the meter before
    a strategy's own hooks and it sees each gradient before the strategy reduces
    or frees it. A strategy may instead call `sample()` where its peak is.
    """

    def __init__(
        self,
        params: Iterable[Tensor],
        extra: Callable[[], Sequence[Tensor]] = tuple,
        hooks: bool = True,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.extra = extra
        self.peak = 0
        self.handles = [
            p.register_post_accumulate_grad_hook(self.on_gradient)
            for p in (self.params if hooks else [])
        ]

    def on_gradient(self, _param: Tensor) -> None:
        """The hook: one sample."""
        self.sample()

    def alive(self) -> int:
        """Bytes of the distinct storages behind every gradient alive now."""
        tensors = [p.grad for p in self.params if p.grad is not None]
        storages = {}
        for tensor in [*tensors, *self.extra()]:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def sample(self) -> int:
        """Take a sample; the bytes alive now."""
        now = self.alive()
        self.peak = max(self.peak, now)
        return now

    def remove(self) -> None:
        """Take the hooks off the parameters (the peak stays readable)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def reset(self) -> None:
        """Forget the peak (a strategy resets it as each backward starts)."""
        self.peak = 0

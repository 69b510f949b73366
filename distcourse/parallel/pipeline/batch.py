"""The batch a pipeline step takes, agreed by its ranks before anything is sent.

Only the first stage's rank holds the input x and only the last stage's the target,
yet every rank must know the micro-batch's shape (to post its receives) and every
rank must refuse a bad batch alike. So a step starts with a small all-gather: each
rank says what it holds (dtype, shape of x; batch size of the target) and all ranks
run the same checks on the same rows, raising the same ValueError.

A collective over all the pipeline's ranks is small beside a step but not free, so
it is started without waiting (`start`) and waited for only before the step's first
transfer (`result`): the first stage's rank computes its first forward meanwhile,
and the other ranks would be waiting for that forward anyway. With inputs="first"
only the first step gathers; later steps compare the batch with it on the ranks
that hold one, as torch's stages infer shapes once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import runtime
from distcourse.comm.p2p import SENDABLE
from distcourse.comm.spec import MAX_DIMS, TensorSpec

Key = tuple[tuple[int, ...], torch.dtype]  # a micro-batch's shape and dtype


class BatchCheck:
    """Agree on each step's batch: `start(x, target)`, then `result()` -> Key.

    `ranks`: the pipeline's global ranks in group order; `first`, `last`: the
    global ranks of the first and last stage; `describe(stage)` names a stage.
    """

    def __init__(
        self,
        ranks: list[int],
        group: dist.ProcessGroup | None,
        first: int,
        last: int,
        stages: int,
        micro_batches: int,
        describe: Callable[[int], str],
        every: bool,
    ) -> None:
        self.ranks, self.group, self.every = ranks, group, every
        self.first, self.last, self.stages = first, last, stages
        self.m, self.describe = micro_batches, describe
        self.agreed: Key | None = None
        self.pending: tuple | None = None  # (work, rows) of a gather in flight

    def start(self, x: Tensor | None, target: Tensor | None) -> None:
        """Send this rank's row to the others (every step, or only the first)."""
        if not self.every and self.agreed is not None:
            self._same(x, target)  # raises here, on the rank that holds the batch
            return
        row = [-1] * (TensorSpec.LENGTH + 1)  # x's TensorSpec row, target batch
        if x is not None and (x.dtype not in SENDABLE or x.dim() > MAX_DIMS):
            row[0] = -2  # every rank raises in result(), after the all-gather
        elif x is not None:
            row[:-1] = TensorSpec.of(x).encode()
        if target is not None:
            row[-1] = len(target)
        mine = torch.tensor(row, dtype=torch.int64, device=runtime.device())
        rows = [torch.empty_like(mine) for _ in self.ranks]
        work = dist.all_gather(rows, mine, group=self.group, async_op=True)
        self.pending = (work, rows)

    def key_of(self, x: Tensor | None) -> Key | None:
        """The key x alone implies, where x passes the checks result() will make of
        it (the target's are left to result()); None otherwise."""
        if x is None or x.dtype not in SENDABLE or not 0 < x.dim() <= MAX_DIMS:
            return None
        if len(x) == 0 or len(x) % self.m:
            return None
        return (len(x) // self.m, *x.shape[1:]), x.dtype

    def result(self) -> Key:
        """The agreed micro-batch shape and dtype; the same ValueError on every rank
        if the batch does not fit the schedule."""
        if self.pending is None:
            assert self.agreed is not None, "start() first"
            return self.agreed
        (work, rows), self.pending = self.pending, None
        work.wait()
        head, tail = (
            rows[self.ranks.index(r)].tolist() for r in (self.first, self.last)
        )
        if head[0] == -2:
            raise ValueError(
                f"{self.describe(0)}: an input that p2p cannot send "
                f"(dtypes {SENDABLE}, at most {MAX_DIMS} dims)"
            )
        if head[0] < 0:
            raise ValueError(f"{self.describe(0)} needs the input batch x")
        if tail[-1] < 0:
            raise ValueError(f"{self.describe(self.stages - 1)} needs the target batch")
        spec = TensorSpec.decode(head[:-1])
        assert spec is not None, head  # written by TensorSpec.encode in start()
        shape, dtype = list(spec.shape), spec.dtype
        batch = shape[0] if shape else 0
        if batch % self.m or batch == 0:
            raise ValueError(
                f"{self.describe(0)}: a batch of {batch} does not split "
                f"into {self.m} equal micro-batches"
            )
        if tail[-1] != batch:
            where = self.describe(self.stages - 1)
            raise ValueError(f"{where}: target batch {tail[-1]} != input batch {batch}")
        self.agreed = (batch // self.m, *shape[1:]), dtype
        return self.agreed

    def _same(self, x: Tensor | None, target: Tensor | None) -> None:
        """With inputs="first": this rank's batch has the first step's shape."""
        micro_shape, dtype = self.agreed  # type: ignore[misc]
        if x is not None and self.key_of(x) != self.agreed:
            raise ValueError(
                f"{self.describe(0)}: inputs='first' agreed on batches of "
                f"{self.m} x {dtype} {list(micro_shape)}; this one is {x.dtype} "
                f"{list(x.shape)}"
            )
        if target is not None and len(target) != micro_shape[0] * self.m:
            where = self.describe(self.stages - 1)
            raise ValueError(
                f"{where}: target batch {len(target)} != the agreed "
                f"{micro_shape[0] * self.m}"
            )

"""One FSDP unit: a module's parameters sharded, gathered to run, scattered back.

`Unit` holds, for one `fully_shard`ed module, this rank's pieces (registered on the
modules in place of the full parameters, so an optimizer on `model.parameters()` sees
only pieces) and one flat buffer for the full parameters, allocated while they are
needed and freed after:

- before forward: all-gather every piece (one collective), copy the rows into the
  buffer, and let the modules see full tensors (leaves of autograd, views of it);
- after forward: the modules see their pieces again; with `reshard_after_forward`
  the buffer's storage is freed (autograd keeps the views, not the bytes); by
  default (None) every unit reshards but the root, as torch's FSDP2; with an int k
  between 1 and N, the rank first keeps its k-th of the full parameters, and the
  gather before backward runs over its group of k ranks only;
- before backward (a hook on the unit's outputs): gather again into the same
  storage, so the tensors autograd saved hold the values once more;
- when every full tensor has its gradient: one reduce-scatter of the padded
  gradients, divided by N, adds each rank's rows to its piece's `.grad`; the buffer
  is freed. Under HSDP (a replicate group beside the shard group) the reduced rows
  are then all-reduced over the replicas and divided by their count. With
  `sync` False (`set_requires_gradient_sync(False)`) nothing is sent: the full
  gradients stay, and the next backward adds to them until one that syncs.

A `MixedPrecisionPolicy` (`policy.py`) makes the gathered buffer `param_dtype` (the
all-gather moves the pieces cast to it) and the reduce-scatter `reduce_dtype`; the
pieces, their gradients and the optimizer keep the pieces' own dtype.

Prefetch (opt-in, FSDP2's `set_modules_to_forward_prefetch` /
`set_modules_to_backward_prefetch`): when this unit's forward (backward) starts, it
launches the all-gathers of the units named as its prefetch with `async_op=True`;
their `unshard` then waits on that pending work instead of gathering again, so the
same bytes move, earlier, and the gather can run while this unit computes. Each
gather of the last step is timed (`timeline`: launch to completion, and when
`unshard` began to wait on it) for `api.hidden_fraction`, with `clock.DeviceTimer`
stamps: CUDA events on a GPU (a host clock there would time the queueing), read
only when `timeline` is, so that timing adds no synchronize to the step.

Chapter 6's notation: a parameter is S(0); gathering makes it B to be used; its
gradient arrives P (each rank's batch contributes) and is reduce-scattered to S(0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.autograd.graph import register_multi_grad_hook

from distcourse import torchcompat
from distcourse.clock import DeviceTimer, Stamp
from distcourse.parallel.fsdp.layout import Piece, pieces
from distcourse.parallel.fsdp.policy import MixedPrecisionPolicy
from distcourse.trace import Event


class Unit:
    """The sharded parameters of one module (those of inner units excluded)."""

    def __init__(
        self,
        owners: list[tuple[nn.Module, str]],
        group: Any,
        reshard_after_forward: bool | None,
        mp_policy: MixedPrecisionPolicy | None = None,
        replicate: Any = None,
    ) -> None:
        self.owners = owners  # (module, attribute name) of each parameter
        self.group = group
        self.replicate = replicate  # HSDP: the group of this rank's replicas
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.reshard_setting = reshard_after_forward  # None: decided by `root`
        self.root = True  # until fully_shard wraps a module around this one
        self.sync = True  # set_requires_gradient_sync
        self.smaller: Any = None  # reshard_after_forward=k: a group of k ranks
        self.kept: Tensor | None = None  # this rank's 1/k of the full, after forward
        full = [getattr(m, name) for m, name in owners]
        self.pieces = pieces([p.shape for p in full], self.world, self.rank)
        self.width = sum(p.padded for p in self.pieces)  # elements of one segment
        self.dtype, self.device = full[0].dtype, full[0].device
        policy = mp_policy or MixedPrecisionPolicy()
        self.param_dtype = policy.param_dtype or self.dtype  # gathered, computed in
        self.reduce_dtype = policy.reduce_dtype or self.param_dtype  # reduced in
        self.sharded = [
            nn.Parameter(piece.cut(p), requires_grad=p.requires_grad)
            for piece, p in zip(self.pieces, full, strict=True)
        ]
        for (module, name), shard in zip(owners, self.sharded, strict=True):
            module._parameters[name] = shard
        self.buffer = torch.empty(
            self.world * self.width, dtype=self.param_dtype, device=self.device
        )
        self.full = [
            self._leaf(piece, start, shard.requires_grad)
            for (piece, start), shard in zip(self._blocks(), self.sharded, strict=True)
        ]
        self.free()
        self.arrived = 0
        self.forward_prefetch: list[Unit] = []
        self.backward_prefetch: list[Unit] = []
        self.pending: Pending | None = None
        self.clock = DeviceTimer(self.device)
        self.spans: list[tuple[str, Stamp, Stamp]] = []  # all_gather k, unshard k
        self.gathers = 0  # how many gathers this unit timed: the k in their names
        for leaf in self.full:
            if leaf.requires_grad:
                leaf.register_post_accumulate_grad_hook(self._on_gradient)

    @property
    def reshard_after_forward(self) -> bool:
        """The setting, or torch's default for None: True but for the root."""
        if self.reshard_setting is None:
            return not self.root
        return self.reshard_setting

    # ---------------------------------------------------- the full parameters --

    def _blocks(self) -> Iterator[tuple[Piece, int]]:
        """Each piece with where its full padded block starts in the buffer."""
        start = 0
        for piece in self.pieces:
            yield piece, start
            start += self.world * piece.padded

    def _leaf(self, piece: Piece, start: int, requires_grad: bool) -> Tensor:
        """A full parameter: a view of the buffer with its own version counter, so
        refilling the buffer before backward does not trip autograd's check."""
        leaf = torch.empty(0, dtype=self.param_dtype, device=self.device)
        stride = torch.empty(piece.shape).stride()
        leaf.set_(self.buffer.untyped_storage(), start, piece.shape, stride)
        return leaf.requires_grad_(requires_grad)

    @property
    def timeline(self) -> list[Event]:
        """This step's "all_gather k" and "unshard k" spans, in seconds."""
        return [Event(n, *map(self.clock.time, (a, b))) for n, a, b in self.spans]

    @property
    def gathered(self) -> bool:
        """Whether the full parameters hold their values now."""
        return self.buffer.untyped_storage().nbytes() > 0

    def unshard(self) -> None:
        """All-gather the pieces into the buffer (nothing if it holds them already);
        a prefetched gather is waited on, not sent again."""
        if self.gathered:
            return
        if self.kept is not None and self.pending is None:
            self._fill(self._regather())  # from the smaller group's rows
            return
        self.kept = None
        waited = self.clock.stamp()  # needed from now: before a gather made here
        if self.pending is None:
            self.prefetch()
        pending, self.pending = self.pending, None
        assert pending is not None
        segments = pending.result(self.sharded)
        done = pending.stamped.wait()  # the gather's completion
        self._fill(segments)
        k = self.gathers
        self.gathers += 1
        self.spans.append((f"all_gather {k}", pending.launched, done))
        self.spans.append((f"unshard {k}", waited, self.clock.stamp()))

    def _fill(self, segments: Tensor) -> None:
        """Give the buffer its bytes back and copy [rank, width] segments in."""
        self.buffer.untyped_storage().resize_(self.buffer.numel() * self._size())
        with torch.no_grad():
            for piece, start in self._blocks():
                block = self.buffer[start : start + self.world * piece.padded]
                block.view(self.world, piece.padded).copy_(
                    segments[:, piece.offset : piece.offset + piece.padded]
                )

    def _keep(self) -> Tensor:
        """After forward, with a smaller group of k ranks: this rank's k-th of the
        full parameters, segments j*m to (j+1)*m (j its place there, m = N / k), so
        the k ranks together hold every segment once."""
        k = dist.get_world_size(self.smaller)
        m, j = self.world // k, dist.get_rank(self.smaller)
        kept = self.buffer.new_empty(m, self.width)
        with torch.no_grad():
            for piece, start in self._blocks():
                block = self.buffer[start : start + self.world * piece.padded]
                rows = block.view(self.world, piece.padded)[j * m : (j + 1) * m]
                kept[:, piece.offset : piece.offset + piece.padded] = rows
        return kept

    def _regather(self) -> Tensor:
        """Before backward: all-gather the kept rows over the smaller group only."""
        kept, self.kept = self.kept, None
        assert kept is not None
        out = kept.new_empty(dist.get_world_size(self.smaller) * kept.numel())
        with torch.no_grad():
            torchcompat.all_gather_tensor(out, kept.reshape(-1), self.smaller)
        return out.view(self.world, self.width)

    def prefetch(self) -> None:
        """Launch this unit's all-gather and return at once (nothing if the full
        parameters are there or a gather is already in flight)."""
        if self.gathered or self.pending is not None:
            return
        with torch.no_grad():
            mine = self._segment().to(self.param_dtype)
            out = torch.empty(  # on the device: no host buffer copied over
                self.world * self.width, dtype=self.param_dtype, device=self.device
            )
            launched = self.clock.stamp()
            work = torchcompat.all_gather_tensor(out, mine, self.group, async_op=True)
        versions = [p._version for p in self.sharded]
        self.pending = Pending(
            work, out.view(self.world, self.width), launched, versions, self.clock
        )

    def _segment(self) -> Tensor:
        """This rank's pieces, each padded, one after another (`width` elements)."""
        return torch.cat(
            [pc.pad(p) for pc, p in zip(self.pieces, self.sharded, strict=True)]
        )

    def gather_segments(self) -> Tensor:
        """One all-gather, waited on: [rank, width], every rank's padded pieces (in
        their own dtype: a state dict's values, not the compute dtype's)."""
        with torch.no_grad():
            mine = self._segment()
            out = torch.empty(
                self.world * self.width, dtype=self.dtype, device=self.device
            )
            torchcompat.all_gather_tensor(out, mine, self.group)
        return out.view(self.world, self.width)

    def free(self) -> None:
        """Give the full parameters' bytes back (the views stay, holding nothing)."""
        self.buffer.untyped_storage().resize_(0)

    def _size(self) -> int:
        return self.buffer.element_size()

    def use_full(self, full: bool) -> None:
        """Let the modules see the full tensors (True) or their pieces (False)."""
        for (module, name), leaf, shard in zip(
            self.owners, self.full, self.sharded, strict=True
        ):
            module._parameters[name] = leaf if full else shard

    # ------------------------------------------------------------- the hooks --

    def before_forward(self, _module: nn.Module, args: Any) -> Any:
        """Gather; launch the prefetches; cast floating inputs to `param_dtype`
        (torch's `cast_forward_inputs`) when that is not the pieces' dtype."""
        self.spans.clear()  # a new step: keep its gathers only (bounded, as DDP's)
        self.gathers = 0
        self.unshard()
        for unit in self.forward_prefetch:
            unit.prefetch()
        self.use_full(True)
        if self.param_dtype == self.dtype:
            return None
        return tuple(
            a.to(self.param_dtype)
            if torch.is_tensor(a) and a.is_floating_point()
            else a
            for a in args
        )

    def after_forward(self, _module: nn.Module, _args: Any, output: Any) -> Any:
        self.use_full(False)
        if self.reshard_after_forward:
            if self.smaller is not None:
                self.kept = self._keep()
            self.free()
        tensors = [t for t in _tensors(output) if t.requires_grad]
        if tensors:
            register_multi_grad_hook(tensors, self._before_backward, mode="any")
        return output

    def _before_backward(self, _grad: Tensor) -> None:
        self.unshard()
        for unit in self.backward_prefetch:
            unit.prefetch()

    def _on_gradient(self, _leaf: Tensor) -> None:
        self.arrived += 1
        if self.arrived == sum(leaf.requires_grad for leaf in self.full):
            self.arrived = 0
            if self.sync:  # else the full gradients stay, to add the next to
                self.reduce_scatter()
            self.free()

    def reduce_scatter(self) -> None:
        """Average the full gradients into the pieces: one reduce-scatter (in
        `reduce_dtype`), and under HSDP one all-reduce over the replicas."""
        with torch.no_grad():
            row = torch.zeros(
                self.world, self.width, dtype=self.reduce_dtype, device=self.device
            )
            for piece, leaf in zip(self.pieces, self.full, strict=True):
                if leaf.grad is not None:
                    at = slice(piece.offset, piece.offset + piece.padded)
                    row[:, at] = piece.full_padded(leaf.grad)
            out = torch.empty(self.width, dtype=self.reduce_dtype, device=self.device)
            torchcompat.reduce_scatter_tensor(out, row.view(-1), self.group)
            out /= self.world
            if self.replicate is not None:
                dist.all_reduce(out, group=self.replicate)
                out /= dist.get_world_size(self.replicate)
            out = out.to(self.dtype)
        for piece, leaf, shard in zip(
            self.pieces, self.full, self.sharded, strict=True
        ):
            if leaf.grad is None:
                continue
            mine = out[piece.offset : piece.offset + piece.padded]
            rows = mine[: piece.rows * piece.row_numel].view_as(shard).clone()
            shard.grad = rows if shard.grad is None else shard.grad + rows
            leaf.grad = None


class Pending:
    """An all-gather in flight: its Work, where it lands, and the Stamps of its
    launch and completion (`DeviceTimer.completion`, as DDP's buckets)."""

    def __init__(
        self,
        work: Any,
        segments: Tensor,
        launched: Stamp,
        versions: list[int],
        clock: DeviceTimer,
    ) -> None:
        self.work = work
        self.segments = segments
        self.launched = launched
        self.versions = versions  # the pieces' version counters at launch
        self.stamped = clock.completion(work)

    def result(self, sharded: list[nn.Parameter]) -> Tensor:
        """Wait for the gather; refuse it if the pieces changed since its launch
        (an optimizer step in between would make it gather stale values)."""
        self.work.wait()
        if self.versions != [p._version for p in sharded]:
            raise RuntimeError(
                "fsdp prefetch: a unit's pieces changed after its all-gather was "
                "prefetched (an optimizer step between launch and use); prefetch only "
                "units that run later in the same forward or backward"
            )
        return self.segments


def _tensors(value: Any) -> list[Tensor]:
    """The tensors in a forward's output (a tensor, or tuples, lists, dicts of them)."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []

"""Point-to-point ops of the emulated NCCL group: issue order, no tags, eager size.

See `distcourse.emulate.nccl` for the rules and their sources. A unit is one op
issued alone, or the ops of one `batch_isend_irecv` (NCCL's group, entered through
c10d's coalescing manager: `start_coalescing` .. `end_coalescing`). Units run one
after the other on the group's emulated stream (one thread). A unit first posts its
receives (a key per receive in the group's store), then each send larger than the
eager size waits for the key of its matching receive -- up to the group's timeout,
then RULE_ORDER -- then gloo carries the data with the per-pair sequence number as
its tag, so messages match in issue order whatever tag the program gave.
"""

from __future__ import annotations

import os
import time
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import distcourse.emulate as _device
from distcourse.emulate import completion, recorder, timing
from distcourse.emulate.works import HeldWork

RULE_TAGS = "tags rule: NCCL ignores tags; messages between a pair match in issue order"
RULE_ORDER = (
    "issue-order rule: a send larger than NCCL's buffers completes only when its "
    "receive runs"
)
RULE_SHARE = 0.8  # of the group's timeout: see PointToPoint._rule_seconds
EAGER_VARIABLE = "DISTCOURSE_NCCL_EAGER_BYTES"
EAGER_BYTES = 4 * 2**20  # NCCL_BUFFSIZE's default (NCCL's environment variables doc)


_GROUPS: weakref.WeakSet = weakref.WeakSet()  # every live group, for drain()


def drain(seconds: float = 10.0) -> None:
    """Wait until every eager send of this process has reached its receiver.

    An eager send completes at once, as on NCCL, whose data wait in the peer's
    buffer; gloo's copy is still in flight, and a rank that destroys its groups now
    resets the connection under the peer's receive. `runtime.shutdown` calls this
    first. A send no one receives is left after `seconds` (NCCL would drop it).
    """
    for group in list(_GROUPS):
        group.drain_eager(seconds)


class NcclRuleError(RuntimeError):
    """A point-to-point op broke one of NCCL's rules (the message names which)."""


def eager_bytes() -> int:
    """Bytes a send may carry before its receive runs (the variable, or 4 MiB)."""
    return int(os.environ.get(EAGER_VARIABLE, EAGER_BYTES))


def done(result: Any) -> dist.Work:
    """A work already complete: what the host sees of an enqueued NCCL op."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def describe(t: torch.Tensor) -> str:
    """`(4, 8) float32`: a tensor's shape and dtype, for messages."""
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def _count(t: torch.Tensor) -> str:
    """`4 float32`: what NCCL matches a message by, its element count and type (a
    () tensor sent to a (1,) one is the same message)."""
    return f"{t.numel()} {str(t.dtype).removeprefix('torch.')}"


def refuse_host(t: torch.Tensor, rank: int, what: str) -> None:
    """Raise NCCL's error for a host tensor (c10d's, where NCCL knows only cuda)."""
    if not _device.is_device_tensor(t):
        raise RuntimeError(
            "No backend type associated with device type cpu (emulated NCCL: rank "
            f"{rank}, {what} of a host tensor {describe(t)}; move it to the device)"
        )


class PointToPoint:
    """send/recv and coalescing for EmulatedNccl (which sets _me, _gloo, _store,
    _stream, _timeout, _sent, _received, _batch)."""

    _me: int
    _gloo: Any
    _store: Any
    _stream: Any
    _timeout: timedelta
    _sent: dict[int, int]
    _received: dict[int, int]
    _batch: list[tuple] | None
    _eager: list

    def track(self) -> None:
        """Let `drain` find this group's eager sends."""
        _GROUPS.add(self)

    def drain_eager(self, seconds: float) -> None:
        """Wait up to `seconds` for each eager send still in flight (see drain)."""
        for work in self._eager:
            try:
                work.wait(timedelta(seconds=seconds))
            except RuntimeError:  # the peer is gone or never received: nothing to do
                pass
        self._eager = []

    def start_coalescing(self, device: Any) -> None:
        self._batch = []

    def end_coalescing(self, device: Any) -> dist.Work:
        ops, self._batch = self._batch or [], None
        return self._submit(ops)

    def _submit(self, ops: list[tuple]) -> HeldWork:
        """Run `ops` as one unit on the stream; its work writes the received data
        in when waited for (completion.RULE_WAIT)."""
        unit = self._stream.submit(self._unit, ops)
        held = [op[5] for op in ops]
        for pending in held:
            pending.ready = unit.result
        return HeldWork(held, [op[4] for op in ops], unit)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        return self._issue("send", tensors, dst, tag, self._sent)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        return self._issue("recv", tensors, src, tag, self._received)

    def recvAnysource(self, tensors: list, tag: int) -> dist.Work:  # noqa: N802
        raise NcclRuleError(
            f"rank {self._me}: NCCL has no receive from any source (recv(src=None))"
        )

    def _issue(
        self, kind: str, tensors: list, peer: int, tag: int, counts: dict
    ) -> dist.Work:
        (tensor,) = tensors
        refuse_host(tensor, self._me, kind)
        n = counts.get(peer, 0)
        counts[peer] = n + 1
        what = f"{kind} of {describe(tensor)} {'to' if kind == 'send' else 'from'}"
        host = _device.host_data(tensor)
        if kind == "send":  # its buffer may not change before the send completes
            held = completion.issue(
                completion.RULE_BUFFER, f"{what} rank {peer}", self._me, inputs=[host]
            )
        else:  # the data land in a scratch, written in at the receive's wait()
            held = completion.issue(
                completion.RULE_WAIT,
                f"{what} rank {peer}",
                self._me,
                outputs=[host],
                values=[torch.empty_like(host)],
            )
        op = (kind, peer, n, tag, tensor, held)
        timing.note_device_work(f"{kind} of {describe(tensor)}", self._me)
        size = tensor.numel() * tensor.element_size()
        recorder.note_message("c10d.send" if kind == "send" else "c10d.recv_", size)
        if self._batch is not None:
            self._batch.append(op)
            return done(tensors)
        return self._submit([op])

    def _unit(self, ops: list[tuple]) -> list:
        """Run one unit on the stream; return gloo's send works (to wait on)."""
        me, seconds = self._me, self._rule_seconds()
        for kind, peer, n, tag, t, _ in ops:
            if kind == "recv":
                self._store.set(f"posted/{peer}>{me}/{n}", "1")
            else:
                self._store.set(
                    f"meta/{me}>{peer}/{n}", f"{tag}|{_count(t)}|{describe(t)}"
                )
        for kind, peer, n, _, t, _ in ops:
            size = t.numel() * t.element_size()
            if kind == "send" and size > eager_bytes():
                if not self._await(f"posted/{me}>{peer}/{n}"):
                    raise NcclRuleError(
                        f"{RULE_ORDER} (NVIDIA/nccl#479): rank {me}'s send #{n} to "
                        f"rank {peer}, {describe(t)} = {size} bytes above the eager "
                        f"size {eager_bytes()}, waited {seconds:.0f} s for rank "
                        f"{peer} to run the matching receive; the pair ({me}, {peer})"
                        " deadlocks on NCCL when each sends before it receives. Post "
                        "the receive with the send in one batch_isend_irecv."
                    )
        sends, recvs = [], []
        for kind, peer, n, tag, t, held in ops:
            host = held.values[0] if held.outputs else _device.host_data(t)
            if kind == "send" and host.numel() * host.element_size() <= eager_bytes():
                # eager: the data leave in NCCL's buffer, the send completes now
                # (gloo's would wait for the receive: the work is kept, not waited)
                self._eager.append(self._gloo.send([host.clone()], peer, n))
            elif kind == "send":
                sends.append(self._gloo.send([host], peer, n))
            else:
                self._check_match(peer, n, tag, t)
                recvs.append((self._gloo.recv([host], peer, n), peer, n, t))
        for work, peer, n, t in recvs:
            self._wait_data(work, peer, n, t)
        self._eager = [w for w in self._eager if not w.is_completed()]
        return sends

    def _wait_data(self, work: Any, src: int, n: int, t: torch.Tensor) -> None:
        """Wait for a receive's data; RULE_ORDER after `_rule_seconds`: the stream
        waits here, and the send it waits for is queued, on the peer's stream,
        behind an op that waits for this one (a cycle NCCL never breaks)."""
        seconds = self._rule_seconds()
        try:
            work.wait(timedelta(seconds=seconds))
        except RuntimeError as err:
            raise NcclRuleError(
                f"{RULE_ORDER}, and a receive blocks its stream until its data "
                f"arrive: rank {self._me}'s receive #{n} from rank {src} "
                f"({describe(t)}) got no data within {seconds:.0f} s; rank {src}'s "
                "matching send is queued behind an op that waits for this rank. "
                "Post each exchange's sends and receives in one batch_isend_irecv."
            ) from err

    def _rule_seconds(self) -> float:
        """How long a rule waits: RULE_SHARE of the group's timeout, so that its
        error, which names the pair, comes before gloo's own timeout on a
        receive that the same deadlock left waiting."""
        return RULE_SHARE * self._timeout.total_seconds()

    def _await(self, key: str) -> bool:
        """True once `key` is in the store, False after `_rule_seconds`.

        Polled, not `store.wait`ed: the groups of a process share one store client,
        and a wait holds it, so another group's stream could not `set` the key its
        peer waits for (two groups each waiting on the other: a pipeline's links).
        """
        end = time.monotonic() + self._rule_seconds()
        pause = 5e-5
        while not self._store.check([key]):
            if time.monotonic() > end:
                return False
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)  # a late peer costs at most 1 ms more
        return True

    def _check_match(self, src: int, n: int, tag: int, t: torch.Tensor) -> None:
        """The n-th message from src is the one this n-th receive gets: say so when
        its tag or shape differs (on NCCL: wrong data, or a hang)."""
        key = f"meta/{src}>{self._me}/{n}"
        if not self._await(key):
            raise NcclRuleError(
                f"rank {self._me}'s receive #{n} from rank {src} ({describe(t)}) "
                f"found no matching send within {self._rule_seconds():.0f} s"
            )
        sent_tag, count, sent = self._store.get(key).decode().split("|", 2)
        if int(sent_tag) != tag or count != _count(t):  # NCCL sees count and type
            raise NcclRuleError(
                f"{RULE_TAGS} (torch's docs of send/isend; pytorch/pytorch#94819): "
                f"rank {self._me}'s receive #{n} from rank {src} (tag {tag}, "
                f"{describe(t)}) is matched with rank {src}'s send #{n} (tag "
                f"{sent_tag}, {sent}); on NCCL it would get that message's data"
            )

"""The wires between stages: one process group and one sender thread per link.

A link is (kind, src, dst): "F" carries activations from src to dst, "B" gradients.
Each `comm.p2p` transfer is a rendezvous (header, ack, data), so a rank that sends
an activation while its neighbour sends it a gradient would wait for the other
forever. Here a send only queues the tensor: a thread per link delivers it while the
rank computes on, and the rank blocks only to receive. Each link has its own group of
two ranks, so the messages of different links never mix, and one sender, so a link's
transfers arrive in the order sent; `schedules.check` proves that is also the order
the receiver expects. Every group carries a finite timeout.

The p2p handshake costs two extra messages, one round trip, per transfer: measured
here on a loaded 2-core machine, 4.6 ms a transfer against 1.7 ms for a bare send.
A pipeline sends the same shapes over and over, and the runner checks them all
before the step, so by default a link shakes hands on its first transfer of a shape
and sends bare tensors while the shape stays the same (handshake="first");
handshake="every" shakes hands every time.
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import runtime
from distcourse.comm import p2p

Link = tuple[str, int, int]  # (kind, src, dst), global ranks


class Links:
    """This rank's links; a collective over the world: every rank builds its own at
    the same time, so that all pipelines' groups are created in one agreed order."""

    def __init__(
        self, mine: list[Link], timeout: timedelta, handshake: str = "first"
    ) -> None:
        if handshake not in ("first", "every"):
            raise ValueError(f"handshake must be 'first' or 'every', got {handshake!r}")
        self.every = handshake == "every"
        self.known: dict[tuple[str, Link], tuple] = {}  # last (shape, dtype) agreed
        everyone: list[list[Link] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sorted(mine))
        every = sorted({tuple(link) for links in everyone for link in links or []})
        me = dist.get_rank()
        self.groups: dict[Link, dist.ProcessGroup] = {}
        for link in every:  # every rank creates every group, members keep theirs
            group = dist.new_group(sorted(link[1:]), timeout=timeout)
            if me in link[1:]:
                self.groups[link] = group  # type: ignore[index]
        self.queues: dict[Link, queue.Queue] = {}
        self.errors: list[BaseException] = []
        for link in self.groups:
            if link[1] == me:
                self.queues[link] = q = queue.Queue()
                threading.Thread(target=self._deliver, args=(link, q), daemon=True,
                                 name=f"pipeline send {link}").start()  # fmt: skip

    def _deliver(self, link: Link, q: queue.Queue) -> None:
        """Sender thread: send each queued tensor in order; keep the first error."""
        while (item := q.get()) is not None:
            try:
                if not self.errors:
                    self._send(link, item)
            except BaseException as err:  # reported by flush()
                what = "activation" if link[0] == "F" else "gradient"
                self.errors.append(RuntimeError(f"sending a {what} to rank {link[2]} "
                                                f"failed: {err}"))  # fmt: skip
            finally:
                q.task_done()
        q.task_done()

    def _send(self, link: Link, x: Tensor) -> None:
        shape, group = (x.shape, x.dtype), self.groups[link]
        if not self.every and self.known.get(("send", link)) == shape:
            dist.send(x.contiguous(), link[2], group=group)
            return
        p2p.send_tensor(x, link[2], group=group)
        self.known[("send", link)] = shape

    def _recv(self, link: Link, expect: tuple[torch.Size, torch.dtype]) -> Tensor:
        group = self.groups[link]
        if not self.every and self.known.get(("recv", link)) == expect:
            x = torch.empty(expect[0], dtype=expect[1], device=runtime.device())
            dist.recv(x, link[1], group=group)
            return x
        x = p2p.recv_tensor(link[1], group=group, expect=expect)
        self.known[("recv", link)] = expect
        return x

    def send(self, link: Link, x: Tensor) -> None:
        """Queue x for delivery over `link`; returns at once."""
        self.raise_errors()
        self.queues[link].put(x.detach())

    def recv(self, link: Link, expect: tuple[torch.Size, torch.dtype]) -> Tensor:
        """Wait for the next tensor on `link`; ValueError unless it is `expect`."""
        self.raise_errors()
        try:
            return self._recv(link, (torch.Size(expect[0]), expect[1]))
        except ValueError:  # a shape refused: p2p names both ranks
            raise
        except Exception as err:
            what = "an activation" if link[0] == "F" else "a gradient"
            msg = f"waiting for {what} from rank {link[1]}: {err}"
            raise RuntimeError(msg) from err

    def flush(self) -> None:
        """Wait until every queued tensor was received; raise a sender's error."""
        for q in self.queues.values():
            q.join()
        self.raise_errors()

    def raise_errors(self) -> None:
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        """Stop the sender threads (the groups stay until the process group ends)."""
        for q in self.queues.values():
            q.put(None)
        self.queues = {}

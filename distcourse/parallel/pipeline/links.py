"""The wires between stages: one process group per link, transfers posted ahead.

A link is (kind, src, dst): "F" carries activations from src to dst, "B" gradients.
Each link has its own group of two ranks, so the messages of different links never
mix, and a link's transfers arrive in the order sent; `schedules.check` proves that
is also the order the receiver expects. Every group carries a finite timeout.

Why transfers are posted ahead: a step's critical path crosses a rank boundary at
every micro-batch's forward and backward, and a receive posted only when its action
needs it makes every such hop pay a round of wake-ups and bookkeeping, even for data
that arrived long before (`bench pipeline` reports what that costs). So, by default
(handshake="first"), a step that meets new shapes first agrees them on every link at
once (`p2p.agree_shapes`: a header and an ack per link and stage, one round trip,
nothing sent yet), as torch's stages do after their shape inference; from then on
the data goes bare. Each inbound link keeps its next receives posted (irecv) while
the rank computes, so the data lands as soon as it is sent; sends are isend, waited
for at the step's end. Before a tensor goes out its shape is checked against the
agreed one: a stage that produces something else fails there, naming itself.

handshake="every" instead shakes hands on every transfer (`p2p.send_tensor`, a
rendezvous of header, ack and data): a rank that sent an activation while its
neighbour sent it a gradient would wait for the other, so there a thread per link
delivers the sends while the rank computes on.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import runtime
from distcourse.comm import p2p

Link = tuple[str, int, int]  # (kind, src, dst), global ranks
Shape = tuple[torch.Size, torch.dtype]
Describe = Callable[[int], str]  # a stage's name, e.g. "stage 2 (rank 1)"
Plan = dict[Link, list[tuple[int, Shape]]]  # per link: (stage, shape) of each transfer
AHEAD = 2  # receives kept posted per inbound link


class Links:
    """This rank's links; a collective over the world: every rank builds its own at
    the same time, so that all pipelines' groups are created in one agreed order."""

    def __init__(
        self, mine: list[Link], timeout: timedelta, handshake: str = "first"
    ) -> None:
        if handshake not in ("first", "every"):
            raise ValueError(f"handshake must be 'first' or 'every', got {handshake!r}")
        self.every = handshake == "every"
        everyone: list[list[Link] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, sorted(mine))
        every = sorted({tuple(link) for links in everyone for link in links or []})
        me = dist.get_rank()
        self.groups: dict[Link, dist.ProcessGroup] = {}
        for link in every:  # every rank creates every group, members keep theirs
            group = dist.new_group(sorted(link[1:]), timeout=timeout)
            if me in link[1:]:
                self.groups[link] = group  # type: ignore[index]
        self.agreed: set[tuple] = set()  # plans whose shapes were agreed
        self.todo: dict[Link, deque[Shape]] = {}  # receives not yet posted
        self.posted: dict[Link, deque[tuple[dist.Work, Tensor]]] = {}
        self.sending: list[tuple[dist.Work, Tensor]] = []  # isends not waited for
        self.queues: dict[Link, queue.Queue] = {}
        self.errors: list[BaseException] = []
        for link in self.groups:
            if self.every and link[1] == me:
                self.queues[link] = q = queue.Queue()
                threading.Thread(
                    target=self._deliver,
                    args=(link, q),
                    daemon=True,
                    name=f"pipeline send {link}",
                ).start()

    # ------------------------------------------------- shapes agreed once ------

    def begin(
        self, sends: Plan, recvs: Plan, describe: Describe = str, key: object = None
    ) -> None:
        """Start a step: what each link will carry, in order, as (sending stage,
        shape). New shapes are agreed with the neighbours first, a header per link
        and stage (ValueError on both ranks if they differ, naming the stage with
        `describe`); then each inbound link posts its first receives. `key` names
        the plan (the same key, the same plan) so that a step need not compare it."""
        if self.every:
            return
        if key is None:
            key = tuple(sorted((k, tuple(v)) for k, v in {**sends, **recvs}.items()))
        plan = key
        if plan not in self.agreed:
            out = [
                (shape, k[2], self.groups[k], _what(k, s, describe))
                for k, v in sends.items()
                for s, shape in _once(v)
            ]
            inn = [
                (shape, k[1], self.groups[k], _what(k, s, describe))
                for k, v in recvs.items()
                for s, shape in _once(v)
            ]
            p2p.agree_shapes(out, inn)
            self.agreed.add(plan)
        self.todo = {k: deque(shape for _, shape in v) for k, v in recvs.items()}
        self.posted = {k: deque() for k in recvs}
        for link in recvs:
            self._post(link)

    def _post(self, link: Link) -> None:
        """Keep AHEAD receives posted on `link` (fewer at the end of the step)."""
        todo, posted, group = self.todo[link], self.posted[link], self.groups[link]
        while todo and len(posted) < AHEAD:
            shape, dtype = todo.popleft()
            x = torch.empty(shape, dtype=dtype, device=runtime.device())
            try:  # gloo may refuse at once, e.g. when the peer's connection closed
                work = dist.irecv(x, link[1], group=group) if x.numel() else None
            except Exception as err:
                what = _moving(link)
                raise RuntimeError(
                    f"waiting for {what} from rank {link[1]}: {err}"
                ) from err
            posted.append((work, x))

    # ------------------------------------------------------------ transfers ------

    def send(self, link: Link, x: Tensor, expect: Shape) -> None:
        """Send x over `link` without waiting; ValueError unless it is `expect`."""
        self.raise_errors()
        if (x.shape, x.dtype) != (torch.Size(expect[0]), expect[1]):
            got, want = _show(x.shape, x.dtype), _show(*expect)
            raise ValueError(
                f"it produced {got}, not the {want} agreed with rank "
                f"{link[2]}; nothing was sent"
            )
        if self.every:
            self.queues[link].put(x.detach())
            return
        x = x.detach().contiguous()
        if x.numel():
            try:  # gloo may refuse at once, e.g. when the peer's connection closed
                work = dist.isend(x, link[2], group=self.groups[link])
            except Exception as err:
                what = _moving(link)
                raise RuntimeError(f"sending {what} to rank {link[2]}: {err}") from err
            self.sending.append((work, x, link))
        while self.sending and self.sending[0][0].is_completed():
            _finish(*self.sending.pop(0))  # done: free it, raise a failure

    def recv(self, link: Link, expect: Shape) -> Tensor:
        """Wait for the next tensor on `link`; ValueError unless it is `expect`."""
        self.raise_errors()
        what = _moving(link)
        work, x = None, None
        if not self.every:
            work, x = self.posted[link].popleft()
            if (x.shape, x.dtype) != (torch.Size(expect[0]), expect[1]):
                raise ValueError(  # a shape refused: the message names both ranks
                    f"expected {_show(*expect)} from rank {link[1]}, the "
                    f"plan said {_show(x.shape, x.dtype)}"
                )
            self._post(link)  # the next receive first: free while we wait here
        try:
            if self.every:
                return p2p.recv_tensor(link[1], group=self.groups[link], expect=expect)
            if work is not None:
                work.wait()
            return x
        except ValueError:  # a shape refused: the message names both ranks
            raise
        except Exception as err:
            msg = f"waiting for {what} from rank {link[1]}: {err}"
            raise RuntimeError(msg) from err

    def flush(self) -> None:
        """Wait until every tensor sent was received; raise a sender's error."""
        for q in self.queues.values():
            q.join()
        self.raise_errors()
        sending, self.sending = self.sending, []
        for item in sending:
            _finish(*item)
        left = [k for k in self.posted if self.posted[k] or self.todo[k]]
        if left:
            raise RuntimeError(f"receives left over on links {left}")

    def raise_errors(self) -> None:
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        """Stop the sender threads (the groups stay until the process group ends)."""
        for q in self.queues.values():
            q.put(None)
        self.queues = {}

    # -------------------------------------------- handshake="every": threads ------

    def _deliver(self, link: Link, q: queue.Queue) -> None:
        """Sender thread: send each queued tensor in order; keep the first error."""
        while (item := q.get()) is not None:
            try:
                if not self.errors:
                    p2p.send_tensor(item, link[2], group=self.groups[link])
            except BaseException as err:  # reported by flush()
                self.errors.append(
                    RuntimeError(
                        f"sending {_moving(link)} to rank {link[2]} failed: {err}"
                    )
                )
            finally:
                q.task_done()
        q.task_done()


def _moving(link: Link) -> str:
    """What a link carries, for error messages: forward links carry activations."""
    return "an activation" if link[0] == "F" else "a gradient"


def _finish(work: dist.Work, x: Tensor, link: Link) -> None:
    """Wait for a send; a failure names the rank it was for (e.g. one that left)."""
    try:
        work.wait()
    except Exception as err:
        what = _moving(link)
        raise RuntimeError(f"sending {what} to rank {link[2]}: {err}") from err


def _once(transfers: list[tuple[int, Shape]]) -> list[tuple[int, Shape]]:
    """Each stage a link carries, with its shape, in the order first met: a header
    each (counted from the schedule alone, so both ends agree how many there are)."""
    return list(dict(transfers).items())


def _what(link: Link, stage: int, describe: Describe) -> str:
    """What a link carries for `stage`, e.g. "the output of stage 0 (rank 0)"."""
    if link[0] == "F":
        return f"the output of {describe(stage)}"
    return f"the input gradient of {describe(stage)}"


def _show(shape: torch.Size | tuple, dtype: torch.dtype) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"

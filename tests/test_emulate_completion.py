"""Work the host reads before it is done (distcourse/emulate/completion.py), planted
on real emulated ranks: each fault ends within 30 s in an error that names its rule,
the rank and the line, and the same program done right passes."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from distcourse import emulate, runtime
from distcourse.emulate import completion
from distcourse.launch import spawn
from distcourse.runtime import RankError

LIMIT = 30.0  # seconds a planted fault may take to end


def _all_reduce(right: bool) -> list[float]:
    x = torch.full((4,), float(dist.get_rank() + 1), device=runtime.device())
    work = dist.all_reduce(x, async_op=True)
    if right:
        work.wait()
    total = x * 2  # read: on a GPU, before wait() this reads whatever x held
    work.wait()
    return total.cpu().tolist()


def _pair() -> tuple[torch.Tensor, int, torch.Tensor]:
    """What two ranks exchange: this rank's tensor (filled with its rank), the peer,
    and the tensor that receives the peer's, on the device."""
    x = torch.full((4,), float(dist.get_rank()), device=runtime.device())
    return x, 1 - dist.get_rank(), torch.empty(4, device=runtime.device())


def _isend(right: bool) -> list[float]:
    x, peer, into = _pair()
    send, recv = dist.isend(x, peer), dist.irecv(into, peer)
    if right:
        send.wait()
    x.add_(10.0)  # changes the buffer: before the send's wait, undefined on NCCL
    send.wait()
    recv.wait()
    return into.cpu().tolist()


def _irecv_read(right: bool) -> list[float]:
    x, peer, into = _pair()
    works = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, into, peer)]
    )
    if right:
        for w in works:
            w.wait()
    seen = (into + 0).cpu().tolist()
    for w in works:
        w.wait()
    return seen


def _copy_to_host(right: bool) -> list[float]:
    x = torch.arange(4.0, device=runtime.device()) + 1
    y = x * 3
    host = y.to("cpu", non_blocking=True)
    if right:
        torch.get_device_module(runtime.device()).synchronize()
    return host.tolist()


PROGRAMS = {  # name: (program, rule, the line's text that breaks it)
    "async all_reduce read before wait()": (
        _all_reduce,
        completion.RULE_WAIT,
        "_all_reduce",
    ),
    "isend buffer changed before its wait": (_isend, completion.RULE_BUFFER, "_isend"),
    "irecv buffer read before its wait": (
        _irecv_read,
        completion.RULE_WAIT,
        "_irecv_read",
    ),
    "non-blocking copy read before a synchronize": (
        _copy_to_host,
        completion.RULE_COPY,
        "_copy_to_host",
    ),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_planted_fault_ends_naming_the_rule_and_done_right_passes(name: str) -> None:
    program, rule, where = PROGRAMS[name]
    start = time.monotonic()
    with pytest.raises(RankError) as failure:
        spawn(program, 2, False, backend="emulated", timeout=LIMIT)
    assert time.monotonic() - start <= LIMIT
    message = str(failure.value)
    assert rule in message and ("rank 0" in message or "rank 1" in message), message
    assert f"in {where}" in message, message
    results = spawn(program, 2, True, backend="emulated", timeout=LIMIT)
    assert all(r and all(v == v for v in r) for r in results), results  # no NaN


def test_results_held_back_are_poison_until_the_wait() -> None:
    """Read from the host data (as a GPU kernel reading the buffer would see it):
    NaN for floats, the lowest value for integers, until the op completes."""
    emulate.setup()
    gpu = torch.device(emulate.DEVICE_TYPE, 0)
    floats, ints = (
        torch.ones(3, device=gpu),
        torch.ones(3, dtype=torch.int64, device=gpu),
    )
    held = completion.issue(
        completion.RULE_WAIT,
        "test op",
        0,
        outputs=[emulate.host_data(floats), emulate.host_data(ints)],
    )
    assert emulate.host_data(floats).isnan().all()
    assert (emulate.host_data(ints) == torch.iinfo(torch.int64).min).all()
    with pytest.raises(completion.CompletionRuleError, match="completion rule"):
        floats.sum()
    completion.complete(held)
    assert floats.sum().item() == 3.0 and ints.sum().item() == 3
    assert not completion.busy()


def test_a_device_synchronize_completes_everything() -> None:
    emulate.setup()
    gpu = torch.device(emulate.DEVICE_TYPE, 0)
    x = torch.ones(3, device=gpu)
    completion.issue(completion.RULE_WAIT, "test op", 0, outputs=[emulate.host_data(x)])
    host = torch.ones(2, device=gpu).to("cpu", non_blocking=True)
    torch.get_device_module(gpu).synchronize()
    assert x.sum().item() == 3.0 and host.tolist() == [1.0, 1.0]
    assert not completion.busy()


def test_only_the_bytes_an_op_holds_are_held() -> None:
    """Pieces of one flat buffer (a ring's, ZeRO's): while one piece is being sent,
    the next may be written and read; the piece itself may not be changed."""
    emulate.setup()
    gpu = torch.device(emulate.DEVICE_TYPE, 0)
    flat = torch.zeros(8, device=gpu)
    sent, other = flat[:4], flat[4:]
    held = completion.issue(
        completion.RULE_BUFFER, "send", 0, inputs=[emulate.host_data(sent)]
    )
    other.add_(1.0)  # other bytes of the same storage: fine
    assert other.sum().item() == 4.0
    with pytest.raises(completion.CompletionRuleError, match="buffer rule"):
        flat[3:5].mul_(2.0)  # overlaps the piece in flight
    completion.complete(held)
    sent.add_(1.0)  # after the wait: fine


def test_a_copy_to_the_host_pickles_as_a_plain_tensor_once_done() -> None:
    """torch.save (DCP's staging copies to the host with non_blocking=True) stores
    a plain tensor after the synchronize, and refuses before it."""
    import io

    emulate.setup()
    gpu = torch.device(emulate.DEVICE_TYPE, 0)
    host = torch.arange(3.0, device=gpu).to("cpu", non_blocking=True)
    with pytest.raises(completion.CompletionRuleError, match="non-blocking copy"):
        torch.save(host, io.BytesIO())
    torch.get_device_module(gpu).synchronize()
    buffer = io.BytesIO()
    torch.save({"t": host}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)["t"]  # weights_only: a plain tensor
    assert type(loaded) is torch.Tensor and loaded.tolist() == [0.0, 1.0, 2.0]


def _poll_a_send() -> tuple[bool, float]:
    """Rank 0 sends above the eager size (its send completes when rank 1's receive
    runs, 0.5 s later) and polls is_completed() at once."""
    import os

    os.environ["DISTCOURSE_NCCL_EAGER_BYTES"] = "0"
    x = torch.ones(4, device=runtime.device())
    if dist.get_rank() == 1:
        time.sleep(0.5)
        dist.recv(x, 0)
        return True, 0.0
    work = dist.isend(x, 1)
    start = time.monotonic()
    first = work.is_completed()
    took = time.monotonic() - start
    work.wait()
    return first, took


def test_is_completed_never_blocks() -> None:
    """As NCCL's query: False while the send waits for its receive, at once (the
    pipeline runner polls it after every isend; a blocking answer deadlocked it)."""
    (first, took), _ = spawn(_poll_a_send, 2, backend="emulated", timeout=LIMIT)
    assert first is False and took < 0.25

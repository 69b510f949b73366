"""NCCL's rules on emulated GPU ranks (issue 36 items 2 and 5): real spawned gloo
ranks, each in a group of the emulated NCCL backend. Collectives on device tensors
equal gloo's on the host; each planted fault ends in an error that names its rule."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from distcourse import emulate, runtime, torchcompat
from distcourse.emulate import nccl, p2p, timing
from distcourse.launch import spawn
from distcourse.runtime import RankError

BIG = 2**21  # float32 elements: 8 MiB, above the 4 MiB eager size


def _group() -> dist.ProcessGroup:
    nccl.register()
    return dist.new_group(
        backend=f"{emulate.DEVICE_TYPE}:{nccl.BACKEND}", timeout=timedelta(seconds=5)
    )


def _collectives(on_device: bool) -> dict:
    g = _group() if on_device else None
    d = runtime.device() if on_device else torch.device("cpu")
    r = dist.get_rank()
    out = {}
    x = torch.arange(4.0, device=d) + r
    dist.all_reduce(x, group=g)
    out["all_reduce"] = x.cpu()
    parts = [torch.empty(2, device=d) for _ in range(2)]
    dist.all_gather(parts, torch.full((2,), float(r), device=d), group=g)
    out["all_gather"] = torch.cat([p.cpu() for p in parts])
    whole = torch.empty(4, device=d)
    dist.all_gather_into_tensor(whole, torch.full((2,), float(r), device=d), group=g)
    out["all_gather_into_tensor"] = whole.cpu()
    piece = torch.empty(2, device=d)
    dist.reduce_scatter_tensor(piece, torch.arange(4.0, device=d) * (r + 1), group=g)
    out["reduce_scatter"] = piece.cpu()
    b = torch.full((2,), float(r), device=d)
    dist.broadcast(b, 1, group=g)
    out["broadcast"] = b.cpu()
    a = torch.empty(2, device=d)
    dist.all_to_all_single(a, torch.tensor([10.0 * r, 10.0 * r + 1], device=d), group=g)
    out["all_to_all"] = a.cpu()
    root = r == 0
    got = [torch.empty(2, device=d) for _ in range(2)] if root else None
    dist.gather(torch.full((2,), float(r), device=d), got, dst=0, group=g)
    out["gather"] = torch.cat([p.cpu() for p in got]) if root else torch.empty(0)
    pieces = [torch.full((2,), 10.0 + i, device=d) for i in range(2)] if root else None
    mine = torch.empty(2, device=d)
    dist.scatter(mine, pieces, src=0, group=g)
    out["scatter"] = mine.cpu()
    dist.barrier(group=g)
    return out


@pytest.mark.skipif(
    not torchcompat.PYTHON_GROUP_COALESCING,
    reason="torch < 2.14: a Python ProcessGroup's batch and collectives differ "
    "(torchcompat.PYTHON_GROUP_COALESCING)",
)
def test_collectives_on_device_equal_gloo_on_host() -> None:
    emulated = spawn(_collectives, 2, True, backend="emulated", timeout=10)
    host = spawn(_collectives, 2, False, backend="gloo", timeout=10)
    for e, h in zip(emulated, host, strict=True):
        assert e.keys() == h.keys()
        assert all(torch.equal(e[k], h[k]) for k in h), (e, h)


def _average() -> list[float]:
    g = _group()
    y = torch.full((3,), float(dist.get_rank() + 1), device=runtime.device())
    dist.all_reduce(y, op=dist.ReduceOp.AVG, group=g)
    return y.cpu().tolist()


def test_avg_works_as_on_nccl() -> None:
    assert spawn(_average, 2, backend="emulated", timeout=10) == [[1.5] * 3] * 2


def _host_tensor() -> None:
    dist.all_reduce(torch.ones(2), group=_group())


def _host_tensors_in_lists() -> list[str]:
    """A host tensor on every rank in each collective with a list of lists on one
    side (outputs of all_gather and gather, inputs of scatter): every rank is
    refused before it sends, and the refusal names the op."""
    g, d = _group(), runtime.device()
    host, devs = torch.ones(2), [torch.ones(2, device=d) for _ in range(2)]
    root = devs if dist.get_rank() == 0 else None
    said = []
    for call in (
        lambda: dist.all_gather([host, host], devs[0], group=g),
        lambda: dist.gather(host, root, group=g),
        lambda: dist.scatter(host, root, group=g),
    ):
        try:
            call()
        except RuntimeError as err:
            said.append(str(err).splitlines()[0])
    return said


def test_host_tensor_in_a_collective_is_refused_with_nccls_message() -> None:
    with pytest.raises(
        RankError, match="No backend type associated with device type cpu"
    ):
        spawn(_host_tensor, 2, backend="emulated", timeout=10)
    for said in spawn(_host_tensors_in_lists, 2, backend="emulated", timeout=10):
        ops = ("allgather", "gather", "scatter")
        assert [line.split(", ")[1].split()[0] for line in said] == list(ops), said


def _tags_relied_on() -> None:
    g, d = _group(), runtime.device()
    if dist.get_rank() == 0:
        dist.send(torch.ones(2, device=d), 1, group=g, tag=1)
        dist.send(torch.full((2,), 2.0, device=d), 1, group=g, tag=2)
    else:
        second = torch.empty(2, device=d)
        dist.recv(second, 0, group=g, tag=2)


def test_tags_relied_on_are_refused() -> None:
    with pytest.raises(RankError, match="tags rule") as caught:
        spawn(_tags_relied_on, 2, backend="emulated", timeout=10)
    assert "rank 1's receive #0 from rank 0 (tag 2" in str(caught.value)


def _exchange(n: int) -> tuple[dist.ProcessGroup, int, torch.Tensor, torch.Tensor]:
    """An exchange of `n` numbers with the other of 2 ranks on the emulated NCCL:
    the group, the peer, this rank's tensor (filled with its rank) and the one that
    receives the peer's, on the device."""
    g, d = _group(), runtime.device()
    mine = torch.full((n,), float(dist.get_rank()), device=d)
    return g, 1 - dist.get_rank(), mine, torch.empty(n, device=d)


def _send_then_receive(n: int) -> float:
    g, peer, mine, theirs = _exchange(n)
    dist.send(mine, peer, group=g)
    dist.recv(theirs, peer, group=g)
    return theirs[0].item()


def test_send_before_receive_above_the_eager_size_deadlocks_aloud() -> None:
    with pytest.raises(RankError, match="issue-order rule") as caught:
        spawn(_send_then_receive, 2, BIG, backend="emulated", timeout=10, deadline=30)
    assert "the pair (" in str(caught.value) and "(2097152,) float32" in str(
        caught.value
    )


def test_send_before_receive_below_the_eager_size_passes() -> None:
    assert spawn(_send_then_receive, 2, 16, backend="emulated", timeout=10) == [
        1.0,
        0.0,
    ]


def _batched(n: int) -> float:
    g, peer, mine, theirs = _exchange(n)
    ops = [
        dist.P2POp(dist.isend, mine, peer, g),
        dist.P2POp(dist.irecv, theirs, peer, g),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return theirs[-1].item()


@pytest.mark.skipif(
    not torchcompat.PYTHON_GROUP_COALESCING,
    reason="torch < 2.14: a Python ProcessGroup's batch and collectives differ "
    "(torchcompat.PYTHON_GROUP_COALESCING)",
)
def test_batch_isend_irecv_of_the_same_exchange_passes() -> None:
    assert spawn(_batched, 2, BIG, backend="emulated", timeout=10) == [1.0, 0.0]


def _timed(synchronize_after: bool) -> bool:
    """An all_reduce timed with the host's clock: right only with a synchronize
    after the work, before the second reading."""
    g = _group()
    x = torch.ones(4, device=runtime.device())
    timing.synchronize()
    start = timing.clock()
    dist.all_reduce(x, group=g)
    if synchronize_after:
        timing.synchronize()
    return timing.clock() >= start


def test_timing_without_synchronize_is_refused() -> None:
    with pytest.raises(RankError, match="timing rule"):
        spawn(_timed, 2, False, backend="emulated", timeout=10)


def test_timing_with_synchronize_passes() -> None:
    assert spawn(_timed, 2, True, backend="emulated", timeout=10) == [True] * 2


def _completion_from_a_callback() -> None:
    g = _group()
    x = torch.ones(4, device=runtime.device())
    timing.synchronize()
    stamps: list[float] = []
    work = dist.all_reduce(x, group=g, async_op=True)
    work.get_future().then(lambda fut: stamps.append(timing.clock()))
    work.wait()
    timing.synchronize()  # the callback's fault is raised here


def test_completion_read_from_a_future_callback_is_refused() -> None:
    with pytest.raises(RankError, match="timing rule"):
        spawn(_completion_from_a_callback, 2, backend="emulated", timeout=10)


def test_eager_size_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert p2p.eager_bytes() == 4 * 2**20
    monkeypatch.setenv(p2p.EAGER_VARIABLE, "1024")
    assert p2p.eager_bytes() == 1024


def _two_links() -> float:
    """A pipeline's two links between one pair: each its own group, a receive
    posted ahead on one while the other sends (ranks 0 and 1 both)."""
    d, me = runtime.device(), dist.get_rank()
    forward, backward = _group(), _group()  # activations 0 -> 1, gradients 1 -> 0
    x = torch.full((4,), 1.0 + me, device=d)
    if me == 0:
        grad = dist.irecv(torch.empty(4, device=d), 1, group=backward)  # ahead
        dist.send(x, 1, group=forward)
        grad.wait()
    else:
        dist.recv(x, 0, group=forward)
        dist.send(x * 2, 0, group=backward)
    return x[0].item()


def test_a_receive_posted_on_one_group_does_not_stall_anothers_send() -> None:
    """The groups of a rank share one store client; a rule's wait that held it
    stalled the other group's send until the timeout (the pipeline's links)."""
    start = time.monotonic()
    assert spawn(_two_links, 2, backend="emulated", timeout=10) == [1.0, 1.0]
    assert time.monotonic() - start < 10


def _default_group() -> dict:
    d = runtime.device()
    found = {"backend": dist.get_backend()}
    objects: list = [None, None]
    dist.all_gather_object(objects, {"rank": dist.get_rank()})  # bytes on the device
    found["objects"] = objects
    try:
        dist.all_reduce(torch.ones(2))  # a host tensor in the ranks' default group
    except RuntimeError as err:
        found["host"] = str(err).splitlines()[0]
    x = torch.ones(2, device=d)
    dist.all_reduce(x)
    found["sum"] = x.cpu().tolist()
    return found


def test_the_ranks_default_group_is_emulated_nccl() -> None:
    for found in spawn(_default_group, 2, backend="emulated", timeout=10):
        assert found["backend"] == runtime.EMULATED_BACKEND == "gpu:emunccl", found
        assert found["objects"] == [{"rank": 0}, {"rank": 1}], found
        assert "No backend type associated with device type cpu" in found["host"]
        assert found["sum"] == [2.0, 2.0], found

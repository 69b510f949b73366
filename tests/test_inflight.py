"""A rank that skips a collective is named, with the collective the others waited in.

The two cases a reader meets: a plain all_reduce one rank leaves out, and an FSDP
forward run on rank 0 only (its first all-gather waits for a rank that returned). On
gloo and on the emulated GPU box, each must end within 30 s in an error that names
the rank that returned and the collective (op, group, sequence number) rank 0 was
in, not gloo's "remote worker crashing". And its controls: a rank that crashes is
not said to have returned; a failure that is no collective's is not explained.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from distcourse import inflight, runtime, torchcompat
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel import fsdp

WITHIN = 30.0  # seconds: an error, never a wait for the spawn's deadline


def _all_reduce_on_rank_0() -> str:
    x = torch.ones(4, device=runtime.device())
    dist.all_reduce(x)  # both ranks: collective #2 (#1 is init's barrier)
    if dist.get_rank() == 0:
        dist.all_reduce(x)  # rank 1 skips it
    return "returned"


def _fsdp_forward_on_rank_0() -> str:
    model = ex.uneven_mlp().to(runtime.device())
    for module in [*model[::2], model]:
        fsdp.fully_shard(module)
    if dist.get_rank() == 0:  # rank 1 builds the model, then leaves
        model(ex.batch(0, 0)[0].to(runtime.device()))
    return "returned"


def _raised(fn: object, backend: str) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(runtime.RankError) as caught:
        spawn(fn, 2, backend=backend, timeout=WITHIN)
    return str(caught.value), time.monotonic() - start


@pytest.mark.parametrize("backend", ["gloo", "emulated"])
def test_a_skipped_all_reduce_names_the_rank_that_returned(backend: str) -> None:
    said, seconds = _raised(_all_reduce_on_rank_0, backend)
    assert seconds <= WITHIN, seconds
    first = said.splitlines()[0]
    assert first == (
        "rank 0 failed: rank 0 waited in all_reduce, collective #3 on group "
        "[0, 1], but rank 1 had returned from its function after #2: rank 1 "
        "skipped a collective the others made"
    ), said


@pytest.mark.parametrize(
    "backend",
    [
        "gloo",
        pytest.param(
            "emulated",
            marks=pytest.mark.skipif(
                not torchcompat.PYTHON_GROUP_COALESCING,
                reason="torch < 2.14: the emulated group's gather of a device "
                "tensor meets 'No backend type associated with device type cpu' "
                "(torchcompat.PYTHON_GROUP_COALESCING)",
            ),
        ),
    ],
)
def test_an_fsdp_forward_on_rank_0_names_the_rank_that_returned(backend: str) -> None:
    said, seconds = _raised(_fsdp_forward_on_rank_0, backend)
    assert seconds <= WITHIN, seconds
    first = said.splitlines()[0]
    assert "rank 0 waited in all_gather, collective #" in first, said
    assert "on group [0, 1], but rank 1 had returned from its function" in first
    assert first.endswith("rank 1 skipped a collective the others made"), said


def _crash_on_rank_1() -> str:
    x = torch.ones(4)
    if dist.get_rank() == 1:
        raise ValueError("rank 1's own bug")
    dist.all_reduce(x)
    return "returned"


def test_a_rank_that_crashed_is_not_said_to_have_returned() -> None:
    with pytest.raises(runtime.RankError) as caught:
        spawn(_crash_on_rank_1, 2, timeout=WITHIN)
    assert "rank 1's own bug" in str(caught.value)
    assert "returned from its function" not in str(caught.value)


def _explained_after_a_bad_value() -> str | None:
    x = torch.ones(4)
    dist.all_reduce(x)
    dist.barrier()
    if dist.get_rank() == 1:
        inflight.mark_returned()  # as if it had left
    dist.barrier()
    return inflight.explain(ValueError("a wrong shape, no collective's fault"))


def test_a_failure_that_is_no_collectives_is_not_explained() -> None:
    assert spawn(_explained_after_a_bad_value, 2) == [None, None]

"""What the links put on the wire, counted by a Ledger against the formula: one
activation per micro-batch forward and one gradient back, a handshake (header and
ack, 80 bytes each) on a link's first transfer of a shape, or on every transfer."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distcourse.comm import p2p
from distcourse.comm.ledger import Ledger
from distcourse.launch import spawn
from distcourse.parallel import pipeline as pp

H = p2p.HEADER_LEN * 8  # bytes of a header, and of an ack
M, MICRO, WIDTH = 4, 2, 8  # micro-batches; rows and columns of each one
DATA = MICRO * WIDTH * 4  # float32 bytes of one activation (and of its gradient)


def _wire(handshake: str) -> list[tuple[int, int]]:
    """Point-to-point (bytes sent, messages sent) of this rank, step by step."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
    pipe = pp.Pipeline(
        pp.split_by_count(model, 2),
        pp.one_f_one_b(2, M),
        F.mse_loss,
        timeout=10,
        handshake=handshake,
    )
    x, y = torch.randn(M * MICRO, WIDTH), torch.randn(M * MICRO, WIDTH)
    out = []
    for _ in range(2):
        with Ledger() as ledger:
            pipe.step(x, y)
        sent = [r.bytes for r in ledger.records if r.kind == "send"]
        out.append((sum(sent), len(sent)))
    pipe.close()
    dist.barrier()
    return out


def test_first_transfer_of_a_shape_shakes_hands_then_bare_tensors() -> None:
    for rank, steps in enumerate(spawn(_wire, 2, "first", timeout=10)):
        # rank 0 sends m activations, rank 1 m gradients; the first step also a
        # header (on the link it sends over) and an ack (on the one it receives on)
        assert steps[0] == (M * DATA + 2 * H, M + 2), rank
        assert steps[1] == (M * DATA, M), rank  # shapes known: data only


def test_every_transfer_shakes_hands_when_asked() -> None:
    for rank, steps in enumerate(spawn(_wire, 2, "every", timeout=10)):
        assert steps[0] == steps[1] == (M * (DATA + 2 * H), 3 * M), rank


def _disagree() -> tuple[str, list[int]]:
    """The ranks cut different models: each infers its own shapes, so they differ."""
    width = 6 if dist.get_rank() == 0 else 4
    model = nn.Sequential(nn.Linear(WIDTH, width), nn.Linear(width, WIDTH))
    pipe = pp.Pipeline(
        pp.split_by_count(model, 2), pp.one_f_one_b(2, M), F.mse_loss, timeout=10
    )
    x, y = torch.randn(M * MICRO, WIDTH), torch.randn(M * MICRO, WIDTH)
    with Ledger() as ledger, pytest.raises(ValueError) as err:
        pipe.step(x, y)
    pipe.close()
    return str(err.value), [r.bytes for r in ledger.records if r.kind == "send"]


def test_ranks_that_disagree_on_shapes_fail_alike_before_any_data() -> None:
    (e0, sent0), (e1, sent1) = spawn(_disagree, 2, timeout=10)
    assert e0 == e1
    assert e0 == (
        "the input gradient of stage 1 (rank 1): rank 0 expected float32[2, 6] from "
        "rank 1, which sent float32[2, 4]; the output of stage 0 (rank 0): rank 1 "
        "expected float32[2, 4] from rank 0, which sent float32[2, 6]"
    )
    assert sent0 == sent1 == [H, H]  # a header and an ack each, no data


class Liar(nn.Module):
    """8 columns on the meta device (shape inference), 7 on real data."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.device.type == "meta" else x[:, :7]


def _lies() -> str:
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), Liar(), nn.Linear(WIDTH, WIDTH))
    stages = [model[:2], model[2:]]
    pipe = pp.Pipeline(stages, pp.gpipe(2, M), F.mse_loss, timeout=3)
    x, y = torch.randn(M * MICRO, WIDTH), torch.randn(M * MICRO, WIDTH)
    with pytest.raises((ValueError, RuntimeError)) as err:
        pipe.step(x, y)
    pipe.close()
    return f"{type(err.value).__name__}: {err.value}"


def test_a_stage_that_breaks_its_shape_fails_before_sending() -> None:
    e0, e1 = spawn(_lies, 2, timeout=3, deadline=40)
    assert e0 == (
        "ValueError: stage 0 (rank 0), F of micro-batch 0: it produced "
        "float32[2, 7], not the float32[2, 8] agreed with rank 1; nothing "
        "was sent"
    )
    assert e1.startswith(
        "RuntimeError: stage 1 (rank 1), F of micro-batch 0: "
        "waiting for an activation from rank 0: "
    )

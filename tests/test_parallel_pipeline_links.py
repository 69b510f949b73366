"""What the links put on the wire, counted by a Ledger against the formula: one
activation per micro-batch forward and one gradient back, a handshake (header and
ack, 80 bytes each) on a link's first transfer of a shape, or on every transfer."""

from __future__ import annotations

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
    pipe = pp.Pipeline(pp.split_by_count(model, 2), pp.one_f_one_b(2, M),
                       F.mse_loss, timeout=10, handshake=handshake)  # fmt: skip
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

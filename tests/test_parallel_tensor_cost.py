"""Wire bytes of tensor parallelism: the ledger of one MLP step on real gloo ranks
equals `sublayer_wire_bytes`, for our layers with and without sequence parallelism
and for torch's parallelize_module; the formula refuses nonsense."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distcourse.examples.gpt import MLP
from distcourse.launch import spawn
from distcourse.parallel.tensor import (
    ParallelMLP,
    step_ledger,
    sublayer_wire_bytes,
)

B, T, H = 2, 8, 16


def _wire_bytes() -> dict[str, int]:
    """Wire bytes of one MLP step on this rank: ours, ours with sequence
    parallelism (its two control messages apart), torch's DTensor plan."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    n, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    mlp, x = MLP(H), torch.randn(B, T, H)
    plain = step_ledger(ParallelMLP.from_module(mlp, check=False), x)
    sp_mlp = ParallelMLP.from_module(mlp, sequence_parallel=True, check=False)
    sp = step_ledger(sp_mlp, x.tensor_split(n, 1)[rank].contiguous())
    control = [r for r in sp.records if r.op == "all_reduce" or r.bytes <= 8]
    mesh = init_device_mesh("cpu", (n,))
    plan = {"fc": ColwiseParallel(), "proj": RowwiseParallel()}
    theirs = step_ledger(parallelize_module(MLP(H), mesh, plan), x)
    return {
        "ours": plain.bytes_sent(),
        "ours, sequence parallel": sp.bytes_sent() - sum(r.wire for r in control),
        "control": sum(r.wire for r in control),
        "torch": theirs.bytes_sent(),
    }


def test_one_mlp_step_puts_two_ring_all_reduces_on_the_wire() -> None:
    n, S = 4, B * T * H * 4
    want = sublayer_wire_bytes(S, n)
    assert want == 2 * 2 * (n - 1) * S // n
    for got in spawn(_wire_bytes, n, timeout=30):
        assert got["ours"] == got["ours, sequence parallel"] == got["torch"] == want
        # the bias's f (an all_reduce of H floats), the lengths (8 bytes gathered)
        assert got["control"] == 2 * (n - 1) * H * 4 // n + 8 * (n - 1)


def test_the_formula_refuses_nonsense() -> None:
    assert sublayer_wire_bytes(1024, 1) == 0  # one rank sends nothing
    with pytest.raises(ValueError, match="n >= 1"):
        sublayer_wire_bytes(1024, 0)

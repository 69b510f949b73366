"""Parallel MLP, attention and a whole block, with and without sequence parallelism:
equal to one process and to torch's parallelize_module (ColwiseParallel,
RowwiseParallel, SequenceParallel); the ledger equals the formula: per MLP forward +
backward, 2 all_reduces of B*T*H floats, or all_gathers and reduce_scatters that put
the same bytes on a ring.
"""

from __future__ import annotations

import helpers
import pytest
import torch
import torch.distributed as dist
from spawned import assert_within, max_diff

from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import MLP, Block, GPTConfig, SelfAttention
from distcourse.launch import spawn
from distcourse.parallel.tensor import (
    ParallelMLP,
    ParallelSelfAttention,
    differences,
    parallelize_block,
)

TOL = 1e-5
B, T, H = 2, 8, 16
CHECK = 112  # bytes of one agreement descriptor (comm.agree)


def _one_process_equal(sp: bool) -> dict[str, float]:
    torch.manual_seed(0)  # the same modules on every rank
    cfg = GPTConfig(n_embd=H, n_head=4)
    mlp, attn, block = MLP(H), SelfAttention(H, 4), Block(cfg)
    diffs = {}
    for name, module, twin in (
        ("mlp", mlp, ParallelMLP.from_module(mlp, sequence_parallel=sp)),
        ("attn", attn, ParallelSelfAttention.from_module(attn, sequence_parallel=sp)),
        ("block", block, parallelize_block(block, sequence_parallel=sp)),
    ):
        torch.manual_seed(1)
        x = torch.randn(B, T, H)
        found = differences(module, twin, x, sequence_parallel=sp)
        diffs.update({f"{name} {k}": v for k, v in found.items()})
    return diffs


@pytest.mark.parametrize(
    "world_size, sp", [(2, False), (2, True), (4, True)], ids=["2", "2-sp", "4-sp"]
)
def test_mlp_attention_block_equal_one_process(world_size: int, sp: bool) -> None:
    assert_within(_one_process_equal, world_size, sp, tol=TOL, at_least=21)


def _mlp_ledger(sp: bool) -> list[tuple[str, int]]:
    """(op, bytes) of every record of one MLP forward + backward on this rank."""
    n = dist.get_world_size()
    torch.manual_seed(0)
    mlp = ParallelMLP.from_module(MLP(H), sequence_parallel=sp)
    # an input that needs a gradient, as inside a model (else f's backward is skipped)
    x = torch.randn(B, T // n if sp else T, H, requires_grad=True)
    with Ledger() as ledger:
        mlp(x).sum().backward()
    return [(rec.op, rec.bytes) for rec in ledger.records if rec.kind != "recv"]


def _torch_mlp_ledger() -> list[tuple[str, int]]:
    """The same for torch's ColwiseParallel -> RowwiseParallel (DTensor's messages
    are functional collectives; the ledger sees them too)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {"fc": ColwiseParallel(), "proj": RowwiseParallel()}
    mlp = parallelize_module(MLP(H), mesh, plan)
    x = torch.randn(B, T, H, requires_grad=True)
    with Ledger() as ledger:
        mlp(x).sum().backward()
    return [(rec.op, rec.bytes) for rec in ledger.records]


def test_ledger_two_all_reduces_of_BTH_per_mlp_step_as_torch() -> None:
    for records in spawn(_mlp_ledger, 2, False, timeout=20):
        # the agreement (112 bytes), g in forward, f in backward: B T H floats each
        assert records == [("all_gather", CHECK)] + [("all_reduce", B * T * H * 4)] * 2
    for records in spawn(_torch_mlp_ledger, 2, timeout=20):
        assert records == [("functional.all_reduce", B * T * H * 4)] * 2


@pytest.mark.parametrize("world_size", [2, 4])
def test_ledger_sequence_parallel_moves_the_same_bytes(world_size: int) -> None:
    n, S = world_size, B * T * H * 4  # S: bytes of the whole activation
    for records in spawn(_mlp_ledger, n, True, timeout=20):
        row = CHECK + 8  # the agreement's row, with this rank's sequence length
        gathers = [b for op, b in records if op == "all_gather" and b > row]
        scatters = sum(b for op, b in records if op == "batch_isend_irecv")
        reduces = [b for op, b in records if op == "all_reduce"]
        # fc's all_gather in forward, proj's reduce_scatter's backward: S / n in each
        assert gathers == [S // n] * 2
        # proj's reduce_scatter, fc's all_gather's backward: our ring sends
        # (n - 1) / n of S each
        assert scatters == 2 * (n - 1) * S // n
        # on a ring an all_gather sends (n - 1) x its input: in all, exactly two
        # ring all_reduces of S, 2 x 2 (n - 1) / n x S, what the plain MLP sends
        assert sum(gathers) * (n - 1) + scatters == 2 * 2 * (n - 1) * S // n
        # plus proj's bias, replicated but used on this rank's tokens: f's all_reduce
        assert reduces == [H * 4]
        # and one control message: the agreement, which carries the sequence
        # lengths the gather needs (no all_gather of its own for them)
        assert [b for op, b in records if op == "all_gather" and b <= row] == [row]


def _against_torch() -> dict[str, float]:
    n, r = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=H, n_head=4))
    theirs = helpers.torch_parallelized(block, helpers.torch_sequence_parallel_plan())
    ours = parallelize_block(block, sequence_parallel=True)
    x = torch.randn(B, T, H).chunk(n, 1)[r]  # this rank's part of the sequence
    y_ours, y_theirs = ours(x), theirs(x)
    (y_ours**2).sum().backward()
    (y_theirs**2).sum().backward()
    diffs = {"output": max_diff(y_ours, y_theirs)}
    for name, p in theirs.named_parameters():
        grad = p.grad.to_local() if p.grad.placements[0].is_shard() else p.grad
        grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        diffs[f"{name} grad"] = max_diff(ours.get_parameter(name).grad, grad)
    return diffs


def test_sequence_parallel_block_equals_torch_parallelize_module() -> None:
    assert_within(_against_torch, 2, tol=TOL, at_least=16)


def _heads_not_divisible() -> str:
    try:
        ParallelSelfAttention.from_module(SelfAttention(12, 3))
    except ValueError as err:
        return str(err)
    return "no error"


def test_heads_not_divisible_is_an_error_before_any_collective() -> None:
    for message in spawn(_heads_not_divisible, 2, timeout=5, deadline=30):
        assert message == "n_head=3 is not divisible by tensor-parallel size 2"

"""Negative controls for chapter 9's flat ZeRO-1/2 (`zero.FlatZero`): its lines
against one process, its wire bytes against 2(N-1)/N x the padded flat size, and its
peak gradient bytes in backward against `FlatLayout.peak_gradient_bytes`. Each
check runs as the chapter runs it, on a FlatZero with a fault planted in its code:
the all-gather after the step skipped (other ranks' pieces never arrive), gradients
all-reduced whole instead of reduce-scattered, and a stage 2 that reduce-scatters
nothing before backward ends. One spawn of 2 ranks.
"""

from __future__ import annotations

import pytest
import torch

from distcourse import checks
from distcourse.comm.ledger import Ledger
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel import zero

CAP = 100 / 2**20  # the chapter's buckets of about 100 bytes


class NoAllGather(zero.FlatZero):
    """The updated pieces stay on their rank: the others' never arrive."""

    def gather_pieces(self, *_: object) -> None:
        return None


class AllReduced(zero.FlatZero):
    """Each bucket all-reduced whole, then this rank's piece kept: DP's traffic
    plus the all-gather."""

    def reduce_region(self, k: int, full: torch.Tensor) -> None:
        torch.distributed.all_reduce(full, group=self.group)
        piece = full.chunk(self.world)[torch.distributed.get_rank(self.group)]
        self.pieces[k].grad = piece.clone().div_(self.world)


class WaitsForBackwardEnd(zero.FlatZero):
    """Stage 2 that reduce-scatters nothing until backward ends."""

    def reduce_full_buckets(self, at_end: bool) -> None:
        if at_end:
            super().reduce_full_buckets(at_end)


def _lines() -> dict[str, str]:
    torch.set_num_threads(1)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    found = {}
    for kind in ex.OPTIMIZERS:
        cls, options = ex.OPTIMIZERS[kind]
        net = NoAllGather(ex.uneven_mlp(), cls, stage=2, bucket_cap_mb=CAP, **options)
        ex.train(net, net.optimizer, rank)
        diff = ex.max_difference(net.module.state_dict(), ex.one_process(world, kind))
        verdict = checks.verdict(checks.max_over_ranks(diff), 1e-5)
        found[kind] = f"flat ZeRO-2 {kind}: max |ranks - one process| {verdict}"
    net = AllReduced(ex.uneven_mlp(), torch.optim.SGD, stage=2, bucket_cap_mb=CAP)
    with Ledger() as ledger:
        ex.train(net, net.optimizer, rank, steps=1)
    found["wire"] = f"wire bytes: {ledger.bytes_sent() == net.layout.step_bytes()}"
    late = WaitsForBackwardEnd(ex.uneven_mlp(), torch.optim.SGD, bucket_cap_mb=CAP)
    ex.train(late, late.optimizer, rank, steps=1)
    same = late.meter.peak == late.layout.peak_gradient_bytes(2)
    found["peak"] = f"peak gradient bytes = formula: {same}"
    return found


@pytest.fixture(scope="module")
def lines() -> dict[str, str]:
    return spawn(_lines, 2, timeout=60)[0]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"flat ZeRO-[12] (SGD|AdamW): max \|4 ranks - one process\|",
    fault="the all-gather after the step skipped: other ranks' pieces never arrive",
)
def test_a_flat_zero_that_never_gathers_fails_one_process(
    lines: dict[str, str],
) -> None:
    for kind in ex.OPTIMIZERS:
        assert lines[kind].endswith("FAIL"), lines[kind]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"flat ZeRO-[12]: wire bytes of a step \d+ = 2\(N-1\)/N x padded",
    fault="each bucket all-reduced whole, then sliced: DP's traffic plus the gather",
)
def test_an_all_reduce_in_place_of_the_reduce_scatter_fails_the_bytes(
    lines: dict[str, str],
) -> None:
    assert lines["wire"].endswith("False"), lines["wire"]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"flat ZeRO-[12]: peak gradient bytes in backward \d+ = formula",
    fault="stage 2 reduce-scattering nothing before backward ends",
)
def test_a_stage_2_that_waits_for_backward_fails_the_peak(
    lines: dict[str, str],
) -> None:
    assert lines["peak"].endswith("False"), lines["peak"]

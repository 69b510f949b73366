"""Negative controls for chapter 9's verdicts on what autograd saves for backward.

One spawn of 4 ranks runs `fsdp.saved_bytes` on planted faults and prints each
verdict line as the chapter does (measured == `fsdp.saved_formula`, by kind); every
line must say False. Faults: a rank fed the whole global batch instead of its own
rows; FSDP kept gathered (reshard_after_forward=False) against the resharding
formula, and the other way round; a formula that counts the shard, not the full
gathered weight.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel import fsdp
from distcourse.parallel.ddp import DDP

WORLD = 4


def _fsdp(reshard: bool) -> torch.nn.Module:
    model = ex.uneven_mlp()
    for module in [*model[::2], model]:
        fsdp.fully_shard(module, reshard_after_forward=reshard)
    return model


def _saved(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, int]:
    got, out = fsdp.saved_bytes(net, x)
    F.mse_loss(out, y).backward()  # let a unit kept gathered give its bytes back
    return got


def _faults() -> dict[str, str]:
    torch.set_num_threads(1)
    rank, lines = torch.distributed.get_rank(), {}
    mine = ex.batch(0, rank)
    rows = len(mine[0])
    everyone = [
        torch.cat(t) for t in zip(*map(ex.batch, [0] * 4, range(4)), strict=True)
    ]
    # (measured, the formula's world and reshard_after_forward), each one fault
    faults = {
        "global batch": (_saved(DDP(ex.uneven_mlp()), *everyone), None, True),
        "kept gathered": (_saved(_fsdp(False), *mine), WORLD, True),
        "resharded": (_saved(_fsdp(True), *mine), WORLD, False),
    }
    table = "saved for backward by kind = formula, 4 stages x N = 1, 2, 4"
    for name, (got, world, reshard) in faults.items():
        same = got == fsdp.saved_formula(ex.uneven_mlp(), rows, world, reshard)
        lines[f"table {name}"] = f"{table}: {same}"
        if world is not None:  # the chapter's line for the model that ran
            lines[name] = (
                f"reshard_after_forward={not reshard}: gathered at most "
                f"{got['gathered_peak']} bytes at once, {got['gathered_after']} after "
                f"forward; by kind = formula: {same}"
            )
    shard = _fsdp(True)  # a formula counting each saved unit's shard, not its buffer
    got = _saved(shard, *mine)
    want = fsdp.saved_formula(ex.uneven_mlp(), rows, WORLD)
    want["gathered"] = sum(4 * p.numel() for p in list(shard.parameters())[2:])
    lines["table shard"] = f"{table}: {got == want}"
    one = _saved(ex.uneven_mlp(), *mine)  # N = 1 on its 4 rows, N = 4 on all 16
    acts = {one["activations"], faults["global batch"][0]["activations"]}
    lines["acts"] = f"activations the same for every stage and N: {len(acts) == 1}"
    return lines


@pytest.fixture(scope="module")
def lines() -> dict[str, str]:
    return spawn(_faults, WORLD, timeout=30)[0]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"saved for backward by kind = formula, 4 stages x N = 1, 2, 4",
    fault="each rank fed the global batch; FSDP kept gathered against the "
    "resharding formula and the other way round; the formula counting the shard, "
    "not the gathered weight",
)
def test_saved_bytes_of_a_fault_fail_the_formula(lines: dict[str, str]) -> None:
    for name in ("global batch", "kept gathered", "resharded", "shard"):
        name = f"table {name}"
        assert lines[name].endswith("False"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"activations the same for every stage and N",
    fault="on 4 ranks each rank fed the whole global batch, not its own rows",
)
def test_an_unsplit_batch_changes_the_activations(lines: dict[str, str]) -> None:
    assert lines["acts"].endswith("False"), lines["acts"]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"reshard_after_forward=(True|False): gathered at most \d+ bytes at once",
    fault="FSDP kept gathered measured against the resharding formula, and resharded "
    "against the kept one",
)
def test_the_other_reshard_fails_the_formula(lines: dict[str, str]) -> None:
    for name in ("kept gathered", "resharded"):
        assert lines[name].endswith("False"), lines[name]

"""What autograd saves for backward under DP, ZeRO-1/2 and FSDP equals the formula.

`fsdp.saved_bytes` on 1, 2 and 4 gloo ranks (groups of the first ranks of 4), one
AdamW step of each strategy on chapter 9's uneven MLP: activations the same for
every stage and N; whole weights saved as parameters under DP and ZeRO-1/2; under
FSDP the gathered buffers instead (N x the padded share: not the shard), freed when
forward returns with reshard_after_forward=True and kept with False. Chapter 4's
count, which skips only parameters, would take the gathered weights for
activations.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from spawned import on_ranks
from torch.distributed.device_mesh import DeviceMesh

from distcourse.examples import sharding as ex
from distcourse.parallel import fsdp, tensor, zero
from distcourse.parallel.ddp import DDP

# (stage, reshard_after_forward): DP, ZeRO-1, ZeRO-2, FSDP, FSDP kept gathered
CASES = ((0, True), (1, True), (2, True), (3, True), (3, False))


def _build(stage: int, group: dist.ProcessGroup, reshard: bool) -> tuple:
    """(net, optimizer) of one strategy over `group`."""
    model = ex.uneven_mlp()
    cls, options = ex.OPTIMIZERS["AdamW"]
    if stage == 3:
        mesh = DeviceMesh.from_group(group, "cpu")
        for module in [*model[::2], model]:
            fsdp.fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
        return model, cls(model.parameters(), **options)
    if stage == 0:
        return DDP(model, process_group=group), cls(model.parameters(), **options)
    opt = zero.ZeroRedundancyOptimizer(model.parameters(), cls, group, **options)
    net = DDP(model, process_group=group) if stage == 1 else zero.ShardedDDP(model, opt)
    return net, opt


def _on_ranks() -> dict:
    torch.set_num_threads(1)
    rank, out = dist.get_rank(), {}
    for members in ([0], [0, 1], [0, 1, 2, 3]):
        group = dist.new_group(members)  # a collective: every rank calls it
        if rank not in members:
            continue
        n = len(members)
        for stage, reshard in CASES:
            net, opt = _build(stage, group, reshard)
            x, y = ex.batch(0, rank)
            got, output = fsdp.saved_bytes(net, x)
            F.mse_loss(output, y).backward()
            opt.step()
            world = n if stage == 3 else None
            want = fsdp.saved_formula(ex.uneven_mlp(), len(x), world, reshard)
            shards = sum(p.numel() * 4 for p in net.parameters()) if stage == 3 else 0
            out[n, stage, reshard] = got, want, shards
    model = ex.uneven_mlp()  # chapter 4's count on FSDP: gathered taken for activations
    for module in [*model[::2], model]:
        fsdp.fully_shard(module)
    out["chapter 4 on FSDP"] = sum(
        tensor.saved_activation_bytes(model, ex.batch(0, rank)[0]).values()
    )
    return out


results = on_ranks(_on_ranks, 4, timeout=60)


def _cases(results: list[dict]) -> list[tuple]:
    return [(k, *v) for r in results for k, v in r.items() if isinstance(k, tuple)]


def test_measured_equals_the_formula_every_stage_and_n(results: list[dict]) -> None:
    cases = _cases(results)
    assert len(cases) == 5 * (1 + 2 + 4)
    for key, got, want, _ in cases:
        assert got == want, (key, got, want)


def test_activations_are_the_same_for_every_stage_and_n(results: list[dict]) -> None:
    assert {got["activations"] for _, got, _, _ in _cases(results)} == {4 * 4 * 23}


def test_fsdp_saves_the_gathered_weight_not_the_shard(results: list[dict]) -> None:
    r = results[0]
    for n in (2, 4):
        got, _, shards = r[n, 3, True]
        assert got["parameters"] == 0 and got["gathered"] > shards
        # layer 1 and 2's buffers: N x (padded rows x columns + padded bias)
        assert got["gathered"] == 4 * n * ((10 + 1) * -(-7 // n) + 8 * -(-3 // n))


def test_resharding_frees_the_saved_weights_and_keeping_does_not(
    results: list[dict],
) -> None:
    for r in results:
        for key, got, *_ in _cases([r]):
            if key[1] == 3:
                freed = got["gathered_after"] == 0
                assert freed == key[2], (key, got)
    # kept gathered, the peak is every unit at once; resharded, one unit
    got = results[0][4, 3, False][0]
    assert got["gathered_peak"] > results[0][4, 3, True][0]["gathered_peak"]
    # kept gathered, every unit's buffer is held after forward, the first layer's
    # too, whose weight autograd did not save (once counted as saved only)
    assert got["gathered_after"] == got["gathered_peak"] > got["gathered"]


def test_chapter_4s_count_takes_gathered_weights_for_activations(
    results: list[dict],
) -> None:
    for r in results:
        assert r["chapter 4 on FSDP"] > r[4, 3, True][0]["activations"]


def test_one_process_without_ranks() -> None:
    model, x = ex.uneven_mlp(), ex.batch(0, 0)[0]
    got, _ = fsdp.saved_bytes(model, x)
    assert got == fsdp.saved_formula(model, len(x))
    assert got["activations"] == sum(tensor.saved_activation_bytes(model, x).values())
    with pytest.raises(ValueError, match="no Linear"):
        fsdp.saved_formula(torch.nn.Sequential(torch.nn.Tanh()), 4)

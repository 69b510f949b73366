"""ZeRO-1/2 on one flat buffer (`FlatZero`) on real gloo ranks: equal to one process
(step 1's gradients, parameters after 3 SGD and 3 AdamW steps), the bytes a step sends
equal to 2(N-1)/N x the padded flat size computed from the model's shapes (DP's
all-reduce), beside our ZeroRedundancyOptimizer's all-reduce + broadcasts (3Ψ-ish),
and the peak gradient bytes of a backward: stage 2 below DP's whole gradient, stage 1
and ShardedDDP (which reduce-scatters after backward) equal to it. A planted stage 2
that waits for the end of backward shows the peak check can fail.

One spawn per world size runs every check and returns the numbers.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import chain_batch, disagreements, tanh_chain, timed_error
from spawned import assert_differs, on_ranks, once, rank_1_differs, said_alike
from torch import nn

from distcourse import runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel.ddp import DDP, average_gradients
from distcourse.parallel.zero import (
    FlatLayout,
    FlatZero,
    GradientMeter,
    ShardedDDP,
    ZeroRedundancyOptimizer,
    step_bytes,
)

ATOL = 1e-5
MB = 2**-20  # bucket_cap_mb of one byte
ONE_BUCKET, SMALL = 25.0, 100 * MB  # the whole model; buckets of about 100 bytes
SHAPES = [tuple(p.shape) for p in ex.uneven_mlp().parameters()]  # 171 numbers


class WaitsForBackwardEnd(FlatZero):
    """Planted fault: stage 2 that reduce-scatters nothing until backward ends, so
    every bucket is alive at once."""

    def reduce_full_buckets(self, at_end: bool) -> None:
        if at_end:
            super().reduce_full_buckets(at_end)


def _reference_gradients(world: int) -> list[torch.Tensor]:
    """Step 1's gradients of one process on every rank's rows."""
    model = ex.uneven_mlp()
    rows = [ex.batch(0, r) for r in range(world)]
    x, y = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    F.mse_loss(model(x), y).backward()
    return [p.grad for p in model.parameters()]


def _train_flat(kind: str, stage: int, cap: float, rank: int, world: int) -> dict:
    cls, options = ex.OPTIMIZERS[kind]
    net = FlatZero(ex.uneven_mlp(), cls, stage=stage, bucket_cap_mb=cap, **options)
    grads: list[torch.Tensor] = []

    def keep_first() -> None:
        if not grads:
            grads.append(torch.cat([p.grad for p in net.pieces]))

    ex.train(net, net.optimizer, rank, before_step=keep_first)
    want = net.layout.pieces(net.layout.flatten(_reference_gradients(world)), rank)
    return dict(
        params=ex.max_difference(net.module.state_dict(), ex.one_process(world, kind)),
        grads=(grads[0] - want).abs().max().item(),
        peak=net.meter.peak,
        peak_formula=net.layout.peak_gradient_bytes(stage),
        state=sum(t.numel() for s in net.optimizer.state.values() for t in s.values()),
    )


def _sent(net: nn.Module, opt: torch.optim.Optimizer, rank: int) -> tuple:
    """(ops, wire bytes) of one training step."""
    with Ledger() as ledger:
        ex.train(net, opt, rank, steps=1)
    return [_family(r.op) for r in ledger.records], ledger.bytes_sent()


def _family(op: str) -> str:
    for family in ("all_gather", "reduce_scatter", "all_reduce", "broadcast"):
        if op.startswith(family):
            return family
    return op


def _bytes(rank: int) -> dict:
    sgd = torch.optim.SGD
    out = {}
    for stage in (1, 2):
        for name, cap in (("one", ONE_BUCKET), ("small", SMALL)):
            net = FlatZero(ex.uneven_mlp(), sgd, stage=stage, bucket_cap_mb=cap, lr=0.1)
            out[f"flat {stage} {name}"] = _sent(net, net.optimizer, rank)
    model = ex.uneven_mlp()
    zero = ZeroRedundancyOptimizer(model.parameters(), sgd, lr=0.1)
    out["zero optimizer"] = _sent(DDP(model), zero, rank)
    part = zero.partition
    out["zero optimizer formula"] = step_bytes(1, part.numel, part.width, rank)
    model = ex.uneven_mlp()
    out["dp"] = _sent(DDP(model), sgd(model.parameters(), lr=0.1), rank)
    return out


def _peaks(rank: int) -> dict:
    """Peak gradient bytes of a backward, measured, on the chapter's model and on a
    chain of eight equal layers (buckets of one layer)."""
    out = {}
    x, y = ex.batch(0, rank)
    model = ex.uneven_mlp()  # DP: every gradient whole at the end of backward
    meter = GradientMeter(model.parameters())
    F.mse_loss(model(x), y).backward()
    average_gradients(model)
    out["dp"] = meter.peak
    meter.remove()
    model = ex.uneven_mlp()
    meter = GradientMeter(model.parameters())  # before ShardedDDP's hooks
    zero = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    F.mse_loss(ShardedDDP(model, zero)(x), y).backward()
    out["sharded ddp"] = meter.peak
    for label, cls in (("late", WaitsForBackwardEnd), ("flat 2", FlatZero)):
        net = cls(ex.uneven_mlp(), torch.optim.SGD, bucket_cap_mb=MB, lr=0.1)
        F.mse_loss(net(x), y).backward()
        out[label] = net.meter.peak, net.layout.peak_gradient_bytes(2)
    cx, cy = chain_batch()
    layer = 72 * 4  # Linear(8, 8): 72 numbers
    net = FlatZero(tanh_chain(), torch.optim.SGD, bucket_cap_mb=layer * MB, lr=0.1)
    F.mse_loss(net(cx), cy).backward()
    out["chain flat 2"] = net.meter.peak, net.layout.peak_gradient_bytes(2)
    return out


def _micro(rank: int, world: int) -> dict:
    """Step 1's gradient pieces from two micro-batches of the rank's rows (loss / 2
    each), against one process; and the reduce-scatters each backward sends."""
    x, y = ex.batch(0, rank)
    out = {}
    for label, stage, sync_first in (
        ("1", 1, True),
        ("2", 2, True),
        ("1 nosync", 1, False),
    ):
        net = FlatZero(
            ex.uneven_mlp(), torch.optim.SGD, stage=stage, bucket_cap_mb=SMALL, lr=0.1
        )
        with Ledger() as ledger:
            for half, sync in zip(range(2), (sync_first, True), strict=True):
                if stage == 1:
                    net.set_requires_gradient_sync(sync)
                rows = slice(half * ex.ROWS // 2, (half + 1) * ex.ROWS // 2)
                (F.mse_loss(net(x[rows]), y[rows]) / 2).backward()
        got = torch.cat([p.grad for p in net.pieces])
        want = net.layout.pieces(net.layout.flatten(_reference_gradients(world)), rank)
        scatters = sum(_family(r.op) == "reduce_scatter" for r in ledger.records)
        out[label] = (got - want).abs().max().item(), scatters, len(net.layout.regions)
    return out


def _on_ranks() -> dict:
    info = runtime.require_initialized()
    rank, world = info.rank, info.world_size
    out: dict = {"rank": rank, "world": world}
    for kind in ex.OPTIMIZERS:
        for stage in (1, 2):
            for name, cap in (("one", ONE_BUCKET), ("small", SMALL)):
                out[kind, stage, name] = _train_flat(kind, stage, cap, rank, world)
    out["bytes"] = _bytes(rank)
    out["peaks"] = _peaks(rank)
    out["micro"] = _micro(rank, world)
    return out


results = on_ranks(_on_ranks, 2, 4, timeout=30)


def _layout(world: int, cap: float) -> FlatLayout:
    """The layout of the chapter's model's shapes on `world` ranks."""
    return FlatLayout([torch.empty(s) for s in SHAPES], world, int(cap * 2**20))


def _padded(world: int, cap: float) -> int:
    """The flat buffer's length, from the model's shapes alone: one bucket is Ψ
    rounded up to a multiple of N; small buckets are the layout's."""
    total = sum(torch.Size(s).numel() for s in SHAPES)
    if cap == ONE_BUCKET:
        return -(-total // world) * world
    return _layout(world, cap).padded


@pytest.mark.parametrize("kind", sorted(ex.OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("buckets", ["one", "small"])
def test_equal_to_one_process(
    results: list[dict], kind: str, stage: int, buckets: str
) -> None:
    for r in results:
        got = r[kind, stage, buckets]
        assert got["grads"] <= ATOL, got  # step 1's gradients, this rank's pieces
        assert got["params"] <= ATOL, got  # after 3 steps


@pytest.mark.parametrize("buckets", ["one", "small"])
def test_optimizer_state_is_this_ranks_pieces(
    results: list[dict], buckets: str
) -> None:
    cap = ONE_BUCKET if buckets == "one" else SMALL
    for r in results:
        world = r["world"]
        regions = _layout(world, cap)
        share = _padded(world, cap) // world
        for stage in (1, 2):  # AdamW: two moments per element, a step per tensor
            assert r["AdamW", stage, buckets]["state"] == (
                2 * share + len(regions.regions)
            )
            assert r["SGD", stage, buckets]["state"] == 0


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("buckets", ["one", "small"])
def test_ledger_bytes_are_two_psi_as_dp(
    results: list[dict], stage: int, buckets: str
) -> None:
    world = results[0]["world"]
    cap = ONE_BUCKET if buckets == "one" else SMALL
    regions = len(_layout(world, cap).regions)
    want = 2 * (world - 1) * _padded(world, cap) * 4 // world
    for r in results:
        ops, sent = r["bytes"][f"flat {stage} {buckets}"]
        assert ops == ["reduce_scatter"] * regions + ["all_gather"] * regions
        assert sent == want
    total = sum(torch.Size(s).numel() for s in SHAPES)
    dp = 2 * (world - 1) * total * 4 // world
    assert all(r["bytes"]["dp"][1] == dp for r in results)
    assert want - dp < 2 * 4 * world * regions  # the padding: < N per region


def test_torchs_design_sends_more(results: list[dict]) -> None:
    """ZeroRedundancyOptimizer on DDP: an all-reduce of Ψ, then each rank's share
    broadcast (3Ψ-ish) where FlatZero sends 2Ψ."""
    world = results[0]["world"]
    print(f"\n{world} ranks, wire bytes per rank of one step (Ψ = 684 bytes):")
    for r in results:
        ours = r["bytes"]["flat 2 one"][1]
        ops, theirs = r["bytes"]["zero optimizer"]
        assert ops == ["all_reduce"] + ["broadcast"] * world
        assert theirs == r["bytes"]["zero optimizer formula"]
        assert theirs > 1.2 * ours
        print(
            f"  rank {r['rank']}: FlatZero {ours}, ZeroRedundancyOptimizer + DDP "
            f"{theirs}, DP {r['bytes']['dp'][1]}"
        )


def test_peak_gradient_bytes(results: list[dict]) -> None:
    world = results[0]["world"]
    total = 4 * sum(torch.Size(s).numel() for s in SHAPES)
    print(f"\n{world} ranks, peak gradient bytes in backward (Ψ = {total} bytes):")
    for r in results:
        peaks = r["peaks"]
        assert peaks["dp"] == total  # every gradient whole
        assert peaks["sharded ddp"] == total  # reduce-scattered after backward
        for buckets in ("one", "small"):  # stage 1: the flat gradient, padded
            got = r["SGD", 1, buckets]
            assert got["peak"] == got["peak_formula"]
            assert total <= got["peak"] < total + 4 * world * 6
        for key in ("flat 2", "chain flat 2"):
            measured, formula = peaks[key]
            assert measured == formula
        assert peaks["flat 2"][0] < total
        assert peaks["chain flat 2"][0] <= 0.3 * 8 * 72 * 4  # 2 layers of 8, padded
        late, _ = peaks["late"]  # planted: every bucket alive at the end
        assert late >= total
        print(
            f"  rank {r['rank']}: DP {peaks['dp']}, ShardedDDP {peaks['sharded ddp']}"
            f", FlatZero 1 {r['SGD', 1, 'one']['peak']}, FlatZero 2 (buckets of "
            f"one tensor) {peaks['flat 2'][0]}, waiting for the end {late}; "
            f"8 layers: FlatZero 2 {peaks['chain flat 2'][0]} of {8 * 72 * 4}"
        )


def _disagreeing() -> dict:
    odd = dist.get_rank() == 1
    sgd = torch.optim.SGD

    def wider() -> None:  # rank 1's model has a wider first layer
        model = nn.Sequential(nn.Linear(4 + odd, 3), nn.Linear(3, 2))
        FlatZero(model, sgd, lr=0.1)

    mlp = ex.uneven_mlp
    return {
        "shape": timed_error(wider),
        "stage": timed_error(lambda: FlatZero(mlp(), sgd, stage=3, lr=0.1)),
        "stage on 1": timed_error(lambda: FlatZero(mlp(), sgd, stage=1 + odd, lr=0.1)),
        "class": timed_error(lambda: FlatZero(mlp(), "adam", lr=0.1)),  # type: ignore[arg-type]
        "cap": timed_error(lambda: FlatZero(mlp(), sgd, bucket_cap_mb=0, lr=0.1)),
    }


disagreeing = once(lambda: disagreements(_disagreeing))


def test_a_model_of_another_shape_on_one_rank_is_named(disagreeing: list[dict]) -> None:
    assert said_alike(disagreeing, "shape") == rank_1_differs(
        "FlatZero", "0.weight float32[3, 5]", "0.weight float32[3, 4]"
    )


def test_bad_arguments_are_named_on_every_rank(disagreeing: list[dict]) -> None:
    for r in disagreeing:
        assert r["stage"][0] == (
            "ValueError: FlatZero: stage must be 1 or 2, got 3 (stage 3 is "
            "parallel.fsdp)"
        )
        assert r["class"][0].startswith("TypeError: FlatZero: optimizer_class must")
        assert r["cap"][0] == "ValueError: FlatZero: bucket_cap_mb must be > 0, got 0"
    assert_differs(disagreeing, "stage on 1", "'stage': 2")


def _no_gradient() -> str:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    net = FlatZero(model, torch.optim.SGD, lr=0.1)
    try:
        net.module[0](torch.ones(1, 4)).sum().backward()
    except RuntimeError as err:
        return str(err)
    return "no error"


def test_a_parameter_without_a_gradient_is_named() -> None:
    said = spawn(_no_gradient, 2, timeout=10)
    assert said[0] == said[1]
    assert said[0].startswith(
        "FlatZero: parameters without a gradient in this backward: 1.weight, 1.bias"
    )


def test_layout_pieces_are_even_and_straddle_parameters() -> None:
    params = [torch.empty(s) for s in SHAPES]  # 60, 10, 70, 7, 21, 3 numbers
    one = FlatLayout(params, 4, 2**20)
    assert (one.numel, one.padded, one.share) == (171, 172, 43)
    (region,) = one.regions
    assert region.params == (5, 4, 3, 2, 1, 0)  # backward order: the last first
    assert region.offsets == (0, 3, 24, 31, 101, 111)
    assert [region.piece(r, 4) for r in range(4)] == [
        slice(0, 43),
        slice(43, 86),
        slice(86, 129),
        slice(129, 172),
    ]  # 2.weight (31 to 101) straddles ranks 0, 1 and 2
    small = FlatLayout(params, 4, 100)  # buckets of about 100 bytes
    assert [r.params for r in small.regions] == [(5, 4, 3), (2,), (1, 0)]
    assert [r.size for r in small.regions] == [32, 72, 72]  # each a multiple of 4
    assert [r.start for r in small.regions] == [0, 32, 104]
    assert small.step_bytes() == 2 * 3 * 176 * 4 // 4
    assert small.peak_gradient_bytes(2) == 4 * (72 + 70)  # 2.weight's bucket
    assert small.peak_gradient_bytes(1) == 4 * 176
    flat = small.flatten([torch.full(s, float(i)) for i, s in enumerate(SHAPES)])
    assert flat[24:31].eq(3).all() and flat[102:104].eq(0).all()  # 2.bias, padding
    assert small.pieces(flat, 1).numel() == 176 // 4


def test_micro_batches_accumulate_as_one_process(results: list[dict]) -> None:
    """Two backward passes before a step sum their gradients (each reduce-scatters,
    stage 2 must); stage 1 without sync on the first reduce-scatters once."""
    for r in results:
        for label, (diff, scatters, regions) in r["micro"].items():
            assert diff <= ATOL, (label, diff)
            assert scatters == regions * (1 if label == "1 nosync" else 2), label


def test_stage_2_refuses_to_skip_the_sync() -> None:
    def run() -> None:
        net = FlatZero(ex.uneven_mlp(), torch.optim.SGD, stage=2, lr=0.1)
        with pytest.raises(ValueError, match="stage 2 keeps only this rank's piece"):
            net.set_requires_gradient_sync(False)

    spawn(run, 2, timeout=30)

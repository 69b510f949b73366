"""ZeRO stages 1 and 2 on real gloo ranks: equal to one process (SGD, which sees a
wrongly scaled gradient, and AdamW), beside torch's ZeroRedundancyOptimizer on the
same parameters, each rank holding its share of the state, every byte by formula.

The model has uneven shapes (171 elements in 6 tensors), so no shard is 1/N exactly.
One spawn per world size runs every check and returns numbers the tests assert on.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.distributed as dist
from helpers import disagreements, timed_error
from spawned import assert_rejected, names_each_case, on_ranks, once, rank_1_differs
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
from torch.nn.parallel import DistributedDataParallel

from distcourse import runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel.ddp import DDP
from distcourse.parallel.zero import (
    ShardedDDP,
    ZeroRedundancyOptimizer,
    formula,
    greedy,
    held,
    step_bytes,
)

ATOL = 1e-5
OPTIMIZERS = ex.OPTIMIZERS


def _difference(model: nn.Module, reference: dict[str, torch.Tensor]) -> float:
    return ex.max_difference(model.state_dict(), reference)


def _run(
    kind: str, stage: int, rank: int, scale: float = 1.0
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Train a fresh model under our ZeRO `stage` (1: with DDP; 2: ShardedDDP)."""
    model = ex.uneven_mlp()
    cls, options = OPTIMIZERS[kind]
    opt = ZeroRedundancyOptimizer(model.parameters(), cls, **options)
    net = DDP(model) if stage == 1 else ShardedDDP(model, opt)
    ex.train(net, opt, rank, before_step=lambda: _scale(model, scale))
    return model, opt


def _scale(model: nn.Module, scale: float) -> None:
    """A planted fault when scale != 1: every gradient multiplied (summed, not
    averaged, for scale = N)."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad *= scale


def _on_ranks() -> dict:
    """Every check on this rank; numbers for the tests to assert on."""
    info = runtime.require_initialized()
    rank, world = info.rank, info.world_size
    out: dict = {"rank": rank, "world": world}
    for kind in OPTIMIZERS:
        reference = ex.one_process(world, kind)
        for stage in (1, 2):
            model, opt = _run(kind, stage, rank)
            out[f"{kind} stage {stage}"] = _difference(model, reference)
            total = sum(p.numel() for p in model.parameters())
            part = opt.partition
            want = formula(stage, total, part.numel[rank], len(part.flat[rank]))
            out[f"{kind} stage {stage} held"] = (held(model.parameters(), opt), want)
        torch_model = ex.uneven_mlp()
        cls, options = OPTIMIZERS[kind]
        theirs = TorchZero(torch_model.parameters(), cls, **options)
        ex.train(DistributedDataParallel(torch_model), theirs, rank)
        out[f"{kind} torch"] = _difference(torch_model, reference)
        out[f"{kind} ours vs torch"] = _difference(model, torch_model.state_dict())
        out[f"{kind} state"] = _state_dicts(kind, opt, theirs, model, rank)
    # planted fault: every gradient N times too large (summed, not averaged)
    model_sgd = _run("SGD", 2, rank, scale=world)[0]
    out["SGD scaled"] = _difference(model_sgd, ex.one_process(world, "SGD"))
    out["shapes"] = [tuple(p.shape) for p in model_sgd.parameters()]
    out["bytes"] = _ledger_bytes(rank)
    return out


def _state_dicts(
    kind: str,
    ours: ZeroRedundancyOptimizer,
    theirs: TorchZero,
    model: nn.Module,
    rank: int,
) -> tuple[bool | None, float]:
    """Consolidated on rank 0, ours equals torch's; loaded back, it trains on alike."""
    ours.consolidate_state_dict(to=0)
    theirs.consolidate_state_dict(to=0)
    same = None
    if rank == 0:
        a, b = ours.state_dict(), theirs.state_dict()
        same = (
            a["param_groups"] == b["param_groups"]
            and a["state"].keys() == b["state"].keys()
        )
        for k in a["state"]:
            for name, value in a["state"][k].items():
                same = same and torch.allclose(value, b["state"][k][name], atol=ATOL)
        shipped = [a]
    else:
        shipped = [None]
    dist.broadcast_object_list(shipped, src=0)
    twin = copy.deepcopy(model)
    cls, options = OPTIMIZERS[kind]
    fresh = ZeroRedundancyOptimizer(twin.parameters(), cls, **options)
    fresh.load_state_dict(shipped[0])
    for net, opt in ((DDP(model), ours), (DDP(twin), fresh)):
        ex.train(net, opt, rank, steps=1)
    return same, _difference(twin, model.state_dict())


def _ledger_bytes(rank: int) -> dict:
    """Records of one stage-2 step."""
    model = ex.uneven_mlp()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    net = ShardedDDP(model, opt)
    with Ledger() as ledger:
        ex.train(net, opt, rank, steps=1)
    records = [(_family(r.op), r.bytes, r.group_size) for r in ledger.records]
    part = opt.partition
    wire = step_bytes(2, part.numel, part.width, rank)
    return dict(
        records=records,
        width=part.width,
        numel=part.numel[rank],
        sent=ledger.bytes_sent(),
        formula=wire,
    )


def _family(op: str) -> str:
    """all_gather_single and all_gather_into_tensor are all_gathers (torch's names
    change between versions; torchcompat picks one)."""
    for family in ("all_gather", "reduce_scatter"):
        if op.startswith(family):
            return family
    return op


results = on_ranks(_on_ranks, 2, 4, timeout=30)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2])
def test_equal_to_one_process(results: list[dict], kind: str, stage: int) -> None:
    assert all(r[f"{kind} stage {stage}"] <= ATOL for r in results)


def test_a_gradient_scaled_by_the_world_size_fails(results: list[dict]) -> None:
    assert all(r["SGD scaled"] > 100 * ATOL for r in results)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_beside_torchs_zero(results: list[dict], kind: str) -> None:
    assert all(r[f"{kind} torch"] <= ATOL for r in results)
    assert all(r[f"{kind} ours vs torch"] <= ATOL for r in results)
    same, resumed = results[0][f"{kind} state"]
    assert same  # consolidated state dicts equal torch's, key for key
    assert all(r[f"{kind} state"][1] <= ATOL for r in results)  # loaded, trains alike


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2])
def test_bytes_held_are_the_formula(results: list[dict], kind: str, stage: int) -> None:
    world = results[0]["world"]
    total = sum(torch.Size(s).numel() for s in results[0]["shapes"])
    for r in results:
        got, want = r[f"{kind} stage {stage} held"]
        if kind == "SGD":  # plain SGD keeps no state
            want = {**want, "optimizer": 0}
        assert got == want
    shares = [r[f"{kind} stage {stage} held"][1]["gradients"] for r in results]
    if stage == 2:
        assert sum(shares) == 4 * total  # the shares cover the model once
        assert max(shares) <= 4 * (total // world + 70)  # 70: the largest tensor


def test_ledger_bytes_are_the_formula(results: list[dict]) -> None:
    world = results[0]["world"]
    total = sum(torch.Size(s).numel() for s in results[0]["shapes"])
    roots = []
    for r in results:
        width, numel = r["bytes"]["width"], r["bytes"]["numel"]
        assert r["bytes"]["records"] == [
            ("reduce_scatter", 4 * world * width, world),  # padded shares
            *[
                ("broadcast", 4 * numel if k == r["rank"] else 0, world)
                for k in range(world)
            ],
        ]
        roots.append(4 * numel)
    assert sum(roots) == 4 * total  # the broadcasts carry the model once
    assert all(r["bytes"]["sent"] == r["bytes"]["formula"] for r in results)
    width = results[0]["bytes"]["width"]
    dp = step_bytes(0, [total // world] * world, width, 0)  # an all-reduce of Ψ
    assert results[0]["bytes"]["formula"] < 1.5 * dp  # ZeRO-2 moves about DP's bytes


def test_partition_is_torchs_sorted_greedy() -> None:
    params = [torch.zeros(n) for n in (5, 9, 1, 9, 3)]
    owned = greedy([params[:3], params[3:]], world=2)
    sizes = [[[t.numel() for t in g] for g in rank] for rank in owned]
    assert sizes == [[[9], [3]], [[5, 1], [9]]]


def test_signature_is_torchs() -> None:
    ours = inspect.signature(ZeroRedundancyOptimizer.__init__).parameters
    theirs = inspect.signature(TorchZero.__init__).parameters
    assert [(p.name, p.default) for p in ours.values()] == [
        (p.name, p.default) for p in theirs.values()
    ]


def test_refused_before_any_collective() -> None:
    model = ex.uneven_mlp()
    with pytest.raises(NotImplementedError, match="overlap_with_ddp is not supported"):
        ZeroRedundancyOptimizer(
            model.parameters(), torch.optim.SGD, overlap_with_ddp=True, lr=0.1
        )
    mixed = [nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2).double())]
    with pytest.raises(ValueError, match="one dtype and device"):
        ZeroRedundancyOptimizer(mixed, torch.optim.SGD, lr=0.1)


def _late_group() -> str:
    opt = ZeroRedundancyOptimizer(ex.uneven_mlp().parameters(), torch.optim.SGD, lr=0.1)
    try:
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})
    except NotImplementedError as err:
        return str(err)
    return "no error"


def test_a_group_added_later_is_refused() -> None:
    errors = spawn(_late_group, 2, timeout=10)
    assert all("add_param_group after construction" in e for e in errors)


def _disagreeing() -> dict:
    """Bad inputs on rank 1 only (or on every rank): each one's error and time."""
    odd = dist.get_rank() == 1
    sgd = torch.optim.SGD

    def wider() -> None:  # rank 1's model has a wider first layer
        model = nn.Sequential(nn.Linear(4 + odd, 3), nn.Linear(3, 2))
        ZeroRedundancyOptimizer(model.parameters(), sgd, lr=0.1)

    def other_buffer() -> None:  # same parameters, a buffer of another shape
        model = ex.uneven_mlp()
        model.register_buffer("scale", torch.ones(2 + odd))
        ShardedDDP(model, ZeroRedundancyOptimizer(model.parameters(), sgd, lr=0.1))

    params = ex.uneven_mlp().parameters
    return {
        "shape": timed_error(wider),
        "adam": timed_error(lambda: ZeroRedundancyOptimizer(params(), "adam", lr=0.1)),
        "adam on 1": timed_error(
            lambda: ZeroRedundancyOptimizer(params(), "adam" if odd else sgd, lr=0.1)
        ),
        "lr": timed_error(lambda: ZeroRedundancyOptimizer(params(), sgd, lr=0.1 + odd)),
        "buffer": timed_error(other_buffer),
    }


disagreeing = once(lambda: disagreements(_disagreeing))

NAMED = {  # a case of _disagreeing -> its whole error, or words of "rank 1 differs"
    "shape": rank_1_differs(  # a model of another shape on one rank
        "ZeroRedundancyOptimizer",
        "group 0 param 0 float32[3, 5]",
        "group 0 param 0 float32[3, 4]",
    ),
    "adam": (  # an optimizer class that is not one, on every rank
        "TypeError: ZeroRedundancyOptimizer: optimizer_class must be a "
        "torch.optim.Optimizer class such as torch.optim.AdamW, got 'adam'"
    ),
    "lr": ("'lr': 1.1} where rank 0 has",),  # other options on one rank
    "buffer": (  # ShardedDDP, a buffer of another shape on one rank
        "ShardedDDP: rank(s) [1] differ from rank 0",
        "scale float32[3] where rank 0 has scale float32[2]",
    ),
}

test_each_bad_call_is_named_alike_on_every_rank = names_each_case(NAMED)


def test_a_bad_optimizer_class_on_one_rank_is_named(disagreeing: list[dict]) -> None:
    assert_rejected(
        disagreeing,
        "adam on 1",
        "ZeroRedundancyOptimizer",
        "optimizer_class must be a torch.optim.Optimizer class",
    )


def test_expected_shares_come_from_the_shapes_as_torch_would_cut_them() -> None:
    from distcourse.parallel.zero.memory import expected_share

    shapes = [(10, 6), (10,), (7, 10), (7,), (3, 7), (3,)]  # chapter 9's MLP
    tensors = [torch.zeros(s) for s in shapes]
    owned = greedy([tensors], world=4)  # the package's partition, for comparison
    for rank in range(4):
        mine = owned[rank][0]
        assert expected_share(shapes, 4, rank, 1) == (
            sum(t.numel() for t in mine),
            len(mine),
        )
        pieces = [
            t.chunk(4)[rank] if rank < len(t.chunk(4)) else t[:0] for t in tensors
        ]
        assert expected_share(shapes, 4, rank, 3) == (
            sum(p.numel() for p in pieces),
            6,
        )
    assert expected_share(shapes, 4, 3, 0) == (171, 6)
    assert [expected_share(shapes, 4, r, 3)[0] for r in range(4)] == [51, 51, 51, 18]

"""FSDP (ZeRO-3) on real gloo ranks: equal to one process (SGD, which sees a wrongly
scaled gradient, and AdamW), resharding or not, beside torch's FSDP2 `fully_shard`
on the same model, each rank holding its dim-0 pieces, every byte by formula, and
bad input refused alike on every rank before any collective.

The model's dims are uneven on purpose: on 4 ranks the head's 3 rows give rank 3 an
empty piece, as torch.chunk does.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import disagreements, refused_alike, timed_error
from spawned import assert_rejected, names_each_case, on_ranks, once, rank_1_differs
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard as torch_fully_shard

from distcourse import runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel.fsdp import (
    full_state_dict,
    fully_shard,
    load_full_state_dict,
    step_bytes,
    units,
    world_mesh,
)
from distcourse.parallel.zero import formula, held

ATOL = 1e-5
OPTIMIZERS = ex.OPTIMIZERS


class Net(nn.Module):
    """Two blocks (each a unit) and a head that belongs to the root unit."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(6, 10), nn.Tanh()), nn.Linear(10, 7)]
        )
        self.head = nn.Linear(7, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def _shard(model: Net, shard=fully_shard, **options: object) -> Net:  # noqa: ANN001
    for block in model.blocks:
        shard(block, **options)
    shard(model, **options)
    return model


def _train(
    model: nn.Module, kind: str, rank: int, scale: float = 1.0
) -> torch.optim.Optimizer:
    """Train on this rank's rows; a `scale` other than 1 plants a fault (every
    gradient multiplied: summed instead of averaged, for scale = N)."""
    opt = ex.optimizer(kind, model.parameters())

    def scale_gradients() -> None:
        for p in model.parameters():
            p.grad *= scale

    ex.train(model, opt, rank, before_step=scale_gradients)
    return opt


def _reference(world: int, kind: str) -> dict:
    return ex.one_process(world, kind, make=Net)


_difference = ex.max_difference


def _on_ranks() -> dict:
    info = runtime.require_initialized()
    rank, world = info.rank, info.world_size
    out: dict = {"world": world}
    for kind in OPTIMIZERS:
        reference = _reference(world, kind)
        for reshard in (True, False):
            model = _shard(Net(), reshard_after_forward=reshard)
            opt = _train(model, kind, rank)
            key = f"{kind} reshard={reshard}"
            out[key] = _difference(full_state_dict(model), reference)
            out[f"{key} freed"] = not any(u.gathered for u in units(model))
            share = sum(p.numel() for p in model.parameters())
            want = formula(3, 0, share, len(list(model.parameters())))
            out[f"{key} held"] = (held(model.parameters(), opt), want)
        theirs = _shard(Net(), shard=torch_fully_shard, mesh=world_mesh())
        _train(theirs, kind, rank)
        options = StateDictOptions(full_state_dict=True)
        out[f"{kind} torch"] = _difference(
            get_model_state_dict(theirs, options=options), reference
        )
        out[f"{kind} same pieces"] = [tuple(p.shape) for p in model.parameters()] == [
            tuple(p.to_local().shape) for p in theirs.parameters()
        ]
        out[f"{kind} loads torch's"] = _exchange(model, theirs)
    scaled = _shard(Net())
    _train(scaled, "SGD", rank, scale=world)
    out["SGD scaled"] = _difference(full_state_dict(scaled), _reference(world, "SGD"))
    out["bytes"] = _ledger(rank)
    out["full"] = full_state_dict(scaled)
    return out


def _exchange(ours: nn.Module, theirs: nn.Module) -> tuple[float, float]:
    """Each side loads the other's full state dict into a fresh sharded model and
    gives it back unchanged: one checkpoint format, either library."""
    options = StateDictOptions(full_state_dict=True)
    from_torch = get_model_state_dict(theirs, options=options)
    fresh = _shard(Net())
    load_full_state_dict(fresh, from_torch)
    ours_back = _difference(full_state_dict(fresh), from_torch)
    from_ours = full_state_dict(ours)
    fresh_torch = _shard(Net(), shard=torch_fully_shard, mesh=world_mesh())
    # (torch replaces the entries of the dict it loads by its pieces: hand it a copy)
    set_model_state_dict(fresh_torch, dict(from_ours), options=options)
    back = get_model_state_dict(fresh_torch, options=options)
    torch_back = _difference(back, from_ours)
    return ours_back, torch_back


def _ledger(rank: int) -> dict:
    """Records of one training step, and the formula's wire bytes."""
    model = _shard(Net())
    x, y = ex.batch(0, rank)
    with Ledger() as ledger:
        F.mse_loss(model(x), y).backward()
    widths = [u.width for u in units(model)]
    return dict(
        records=[(r.op, r.bytes, r.group_size) for r in ledger.records],
        widths=widths,
        wire=step_bytes(units(model), dist.get_world_size()),
        sent=ledger.bytes_sent(),
    )


results = on_ranks(_on_ranks, 2, 4, timeout=30)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("reshard", [True, False])
def test_equal_to_one_process(results: list[dict], kind: str, reshard: bool) -> None:
    assert all(r[f"{kind} reshard={reshard}"] <= ATOL for r in results)
    assert all(r[f"{kind} reshard={reshard} freed"] for r in results)


def test_a_gradient_scaled_by_the_world_size_fails(results: list[dict]) -> None:
    assert all(r["SGD scaled"] > 100 * ATOL for r in results)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_beside_torchs_fully_shard(results: list[dict], kind: str) -> None:
    assert all(r[f"{kind} torch"] <= ATOL for r in results)
    assert all(r[f"{kind} same pieces"] for r in results)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_full_state_dicts_load_into_either_library(
    results: list[dict], kind: str
) -> None:
    assert all(r[f"{kind} loads torch's"] == (0.0, 0.0) for r in results)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_bytes_held_are_the_formula(results: list[dict], kind: str) -> None:
    world = results[0]["world"]
    total = sum(t.numel() for t in results[0]["full"].values())
    shares = []
    for r in results:
        got, want = r[f"{kind} reshard=True held"]
        if kind == "SGD":
            want = {**want, "optimizer": 0}
        assert got == want
        shares.append(got["parameters"])
    assert sum(shares) == 4 * total  # the pieces cover the model once
    assert max(shares) <= 4 * -(-total // world) + 4 * 3 * 10  # a row per tensor


def test_ledger_bytes_are_the_formula(results: list[dict]) -> None:
    world = results[0]["world"]
    for r in results:
        widths = r["bytes"]["widths"]  # root first, then the blocks
        gathers = [op for op in r["bytes"]["records"] if op[0].startswith("all_g")]
        scatters = [op for op in r["bytes"]["records"] if op[0].startswith("reduce")]
        # by default (torch's) each block gathers before forward and again before
        # backward; the root, kept gathered, once
        once = [widths[0], *(2 * widths[1:])]
        assert sorted(g[1] for g in gathers) == sorted(4 * w for w in once)
        assert sorted(s[1] for s in scatters) == sorted(4 * world * w for w in widths)
        calls = 3 * sum(widths) - widths[0]
        assert r["bytes"]["wire"] == (world - 1) * 4 * calls
        assert r["bytes"]["sent"] == r["bytes"]["wire"]  # the ledger's wire bytes


def _bad_calls() -> dict:
    world = dist.get_world_size()
    errors: dict = {}
    model = _shard(Net())
    try:
        fully_shard(model.blocks[0])
    except ValueError as err:
        errors["twice"] = str(err)
    grid = init_device_mesh("cpu", (1, world // 2, 2))
    try:
        fully_shard(Net(), mesh=grid)
    except ValueError as err:
        errors["3-D mesh"] = str(err)
    early = Net()
    opt = torch.optim.SGD(early.parameters(), lr=0.1)
    _shard(early)
    x, y = ex.batch(0, dist.get_rank())
    F.mse_loss(early(x), y).backward()
    try:
        opt.step()
    except ValueError as err:
        errors["optimizer first"] = str(err)
    state = full_state_dict(model)
    state["head.weight"] = torch.zeros(4, 7)
    try:
        load_full_state_dict(_shard(Net()), state)
    except ValueError as err:
        errors["shapes"] = str(err)
    return errors


def test_bad_input_is_refused_alike_on_every_rank() -> None:
    errors = refused_alike(_bad_calls, ranks=4)
    assert "already applied to this Sequential" in errors["twice"]
    assert "must be 1-D (shard) or 2-D (replicate, shard)" in errors["3-D mesh"]
    assert "build the optimizer after fully_shard" in errors["optimizer first"]
    assert "head.weight (4, 7) != (3, 7)" in errors["shapes"]


def _resume(state: dict) -> dict:
    """Load a full state dict saved on other ranks; it trains on as one process."""
    model = _shard(Net())
    load_full_state_dict(model, state)
    return full_state_dict(model)


def test_a_full_state_dict_saved_on_n_ranks_loads_on_2(results: list[dict]) -> None:
    saved = results[0]["full"]
    loaded = spawn(_resume, 2, saved, timeout=30)
    assert all(_difference(s, saved) == 0 for s in loaded)


def _disagreeing() -> dict:
    """Bad inputs on rank 1 only (or on every rank): each one's error and time."""
    odd = dist.get_rank() == 1

    def wider() -> None:  # rank 1's second block is wider
        model = Net()
        if odd:
            model.blocks[1] = nn.Linear(10, 9)
        _shard(model)

    def sharded_twice() -> None:  # rank 1 alone shards a block twice
        model = Net()
        fully_shard(model.blocks[0])
        if odd:
            fully_shard(model.blocks[0])
        fully_shard(model.blocks[1])

    return {
        "shape": timed_error(wider),
        "dtype": timed_error(lambda: fully_shard(Net().double() if odd else Net())),
        "reshard": timed_error(lambda: fully_shard(Net(), reshard_after_forward=odd)),
        "twice": timed_error(sharded_twice),
    }


disagreeing = once(lambda: disagreements(_disagreeing))

NAMED = {  # a case of _disagreeing -> its whole error, or words of "rank 1 differs"
    "shape": rank_1_differs(  # a model of another shape on one rank
        "fully_shard", "Linear.weight float32[9, 10]", "Linear.weight float32[7, 10]"
    ),
    "dtype": ("Net.blocks.0.0.weight float64[10, 6] where rank 0 has",),
    "reshard": ("'reshard_after_forward': True",),  # other settings
}

test_each_bad_call_is_named_alike_on_every_rank = names_each_case(NAMED)


def test_a_rank_that_rejects_its_arguments_is_named(disagreeing: list[dict]) -> None:
    assert_rejected(
        disagreeing, "twice", "fully_shard", "already applied to this Sequential"
    )

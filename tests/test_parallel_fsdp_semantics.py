"""FSDP2's semantics in ours, on real gloo ranks, each beside one process and torch's
`fully_shard` with the same arguments (torch 2.14.1):

- defaults: `reshard_after_forward=None` reshards every unit but the root, so the
  root gathers once a step and the others twice, as many all-gathers as torch's;
  an int is 1 (False), the shard size (True), or a divisor between: on 4 ranks, 2
  gathers over pairs before backward, equal to one process and torch's (1e-5);
- `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`: losses and sharded
  gradients equal to torch's with the same policy (within 1e-6), within bf16's
  precision of fp32's one process (2e-2), pieces and gradients kept fp32;
- `set_requires_gradient_sync(False)`: two micro-batches, one reduce-scatter per
  unit, SGD's step equal to one process on the whole batch (1e-6);
- `clip_grad_norm_` over sharded gradients: the norm and clipped gradients of one
  process's `torch.nn.utils.clip_grad_norm_` (1e-6), and torch's FSDP2 norm;
- HSDP on a 2 x 2 mesh (replicate, shard): 3 SGD steps equal to one process and to
  torch's HSDP (1e-5), step 1's gradients to one process's (1e-6).

Bad arguments raise ValueError before any collective, on every rank.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from spawned import assert_says, on_ranks
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy as TorchPolicy
from torch.distributed.fsdp import fully_shard as torch_fully_shard

from distcourse import runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel import fsdp

GRAD_TOL = 1e-6  # fp32 gradients, one step: sums in another order
TRAIN_TOL = 1e-5  # 3 SGD steps
BF16_TOL = 2e-2  # bf16 compute against fp32's: bf16 keeps 8 bits (2^-8 = 4e-3 rel.)


class Net(nn.Module):
    """Two blocks (each a unit) and a head that belongs to the root unit."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Linear(6, 10), nn.Linear(10, 7)])
        self.head = nn.Linear(7, 3)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def _shard(model: Net, shard=fsdp.fully_shard, **options: object) -> Net:  # noqa: ANN001
    for block in model.blocks:
        shard(block, **options)
    shard(model, **options)
    return model


def _torch(model: Net, **options: object) -> Net:
    return _shard(model, torch_fully_shard, mesh=fsdp.world_mesh(), **options)


def _loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Mean squared error in fp32 whatever the output's dtype."""
    return ((model(x).float() - y) ** 2).mean()


def _whole(world: int, step: int = 0) -> tuple[Tensor, Tensor]:
    rows = [ex.batch(step, r) for r in range(world)]
    return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])


def _one_process_grads(world: int, max_norm: float | None = None) -> tuple:
    """One process's gradients on every rank's rows (step 0), clipped if asked."""
    model = Net()
    _loss(model, *_whole(world)).backward()
    norm = None
    if max_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
    return {n: p.grad for n, p in model.named_parameters()}, norm


def _largest(t: Tensor) -> float:
    """max |t|, 0.0 for an empty piece (rank 3 holds no row of a 3-row head)."""
    return t.abs().max().item() if t.numel() else 0.0


def _grad_difference(model: nn.Module, full: dict[str, Tensor]) -> float:
    """Largest |this rank's gradient piece - its cut of one process's|."""
    want = fsdp.local_pieces(model, full)
    got = {n: p.grad for n, p in model.named_parameters()}
    return max(_largest(got[n] - want[n]) for n in want)


def _versus_torch(ours: nn.Module, theirs: nn.Module) -> float:
    """Largest |our gradient piece - torch's local piece| (the same chunks)."""
    pairs = zip(ours.parameters(), theirs.parameters(), strict=True)
    return max(_largest(a.grad - b.grad.to_local()) for a, b in pairs)


def _defaults(rank: int, world: int) -> dict:
    out: dict = {}
    for name, shard in (("ours", _shard), ("torch", _torch)):
        model = shard(Net())
        x, y = ex.batch(0, rank)
        with Ledger() as ledger:
            _loss(model, x, y).backward()
        out[f"gathers {name}"] = sum("all_gather" in r.op for r in ledger.records)
    model = _shard(Net())
    out["resharded"] = [u.reshard_after_forward for u in fsdp.units(model)]
    ex.train(model, ex.optimizer("SGD", model.parameters()), rank)
    ref = ex.one_process(world, "SGD", make=Net)
    out["defaults trained"] = ex.max_difference(fsdp.full_state_dict(model), ref)
    ints = [
        u.reshard_after_forward
        for u in fsdp.units(_shard(Net(), reshard_after_forward=1))
    ]
    ints += [
        u.reshard_after_forward
        for u in fsdp.units(_shard(Net(), reshard_after_forward=world))
    ]
    out["ints"] = ints
    return out


def _mixed(rank: int, world: int) -> dict:
    out: dict = {}
    bf16 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    ours = _shard(Net(), mp_policy=fsdp.MixedPrecisionPolicy(**bf16))
    theirs = _torch(Net(), mp_policy=TorchPolicy(**bf16))
    x, y = ex.batch(0, rank)
    with Ledger() as ledger:
        loss = _loss(ours, x, y)
        loss.backward()
    out["mp step bytes"] = (
        ledger.bytes_sent(),
        fsdp.step_bytes(fsdp.units(ours), world),
    )
    their_loss = _loss(theirs, x, y)
    their_loss.backward()
    out["mp loss"] = abs(loss.item() - their_loss.item())
    out["mp grads"] = _versus_torch(ours, theirs)
    full, _ = _one_process_grads(world)
    out["mp one process"] = _grad_difference(ours, full)
    kept = {p.dtype for p in ours.parameters()} | {
        p.grad.dtype for p in ours.parameters()
    }
    out["mp kept"] = sorted(map(str, kept))
    return out


def _no_sync(rank: int, world: int) -> dict:
    out: dict = {}
    x, y = ex.batch(0, rank)
    grads = {}
    for name, shard in (("ours", _shard), ("torch", _torch)):
        model = shard(Net())
        with Ledger() as ledger:
            for i, (xs, ys) in enumerate(zip(x.chunk(2), y.chunk(2), strict=True)):
                model.set_requires_gradient_sync(i == 1)
                (_loss(model, xs, ys) / 2).backward()
        out[f"scatters {name}"] = sum(r.op.startswith("reduce") for r in ledger.records)
        grads[name] = model
    full, _ = _one_process_grads(world)
    out["no sync one process"] = _grad_difference(grads["ours"], full)
    out["no sync torch"] = _versus_torch(grads["ours"], grads["torch"])
    out["units"] = len(fsdp.units(grads["ours"]))
    return out


def _clip(rank: int, world: int) -> dict:
    out: dict = {}
    max_norm = 0.1  # well below the gradient's norm (about 1): clipping acts
    ours, theirs = _shard(Net()), _torch(Net())
    x, y = ex.batch(0, rank)
    for model in (ours, theirs):
        _loss(model, x, y).backward()
    norm = fsdp.clip_grad_norm_(ours, max_norm).item()
    their_norm = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm)
    full, one_norm = _one_process_grads(world, max_norm)
    out["clip norm one process"] = abs(norm - one_norm)
    out["clip norm torch"] = abs(norm - their_norm.full_tensor().item())
    out["clip grads one process"] = _grad_difference(ours, full)
    out["clip grads torch"] = _versus_torch(ours, theirs)
    out["clip norm"] = norm
    return out


def _hsdp(rank: int, world: int) -> dict:
    out: dict = {}
    mesh = init_device_mesh(
        runtime.device().type, (2, world // 2), mesh_dim_names=("replicate", "shard")
    )
    ours = _shard(Net(), mesh=mesh)
    x, y = ex.batch(0, rank)
    _loss(ours, x, y).backward()
    full, _ = _one_process_grads(world)
    out["hsdp grads"] = _grad_difference(ours, full)
    out["hsdp pieces"] = [tuple(p.shape) for p in ours.parameters()]
    ours = _shard(Net(), mesh=mesh)
    ex.train(ours, ex.optimizer("SGD", ours.parameters()), rank)
    got = fsdp.full_state_dict(ours)
    out["hsdp one process"] = ex.max_difference(
        got, ex.one_process(world, "SGD", make=Net)
    )
    theirs = _shard(Net(), torch_fully_shard, mesh=mesh)
    ex.train(theirs, ex.optimizer("SGD", theirs.parameters()), rank)
    options = StateDictOptions(full_state_dict=True)
    out["hsdp torch"] = ex.max_difference(
        got, get_model_state_dict(theirs, options=options)
    )
    return out


def _smaller(rank: int, world: int) -> dict:
    """reshard_after_forward=2 on 4 ranks: backward gathers over pairs of ranks."""
    out: dict = {}
    ours = _shard(Net(), reshard_after_forward=2)
    x, y = ex.batch(0, rank)
    with Ledger() as ledger:
        _loss(ours, x, y).backward()
    out["pair gathers"] = sorted(
        r.group_size for r in ledger.records if "all_gather" in r.op
    )
    out["pair bytes"] = (ledger.bytes_sent(), fsdp.step_bytes(fsdp.units(ours), world))
    ours = _shard(Net(), reshard_after_forward=2)
    ex.train(ours, ex.optimizer("SGD", ours.parameters()), rank)
    got = fsdp.full_state_dict(ours)
    ref = ex.one_process(world, "SGD", make=Net)
    out["pair one process"] = ex.max_difference(got, ref)
    theirs = _torch(Net(), reshard_after_forward=2)
    ex.train(theirs, ex.optimizer("SGD", theirs.parameters()), rank)
    options = StateDictOptions(full_state_dict=True)
    theirs_state = get_model_state_dict(theirs, options=options)
    out["pair torch"] = ex.max_difference(got, theirs_state)
    return out


def _on_ranks() -> dict:
    info = runtime.require_initialized()
    torch.set_num_threads(1)
    rank, world = info.rank, info.world_size
    out = {"world": world}
    for part in (_defaults, _mixed, _no_sync, _clip):
        out.update(part(rank, world))
    if world == 4:
        out.update(_hsdp(rank, world))
        out.update(_smaller(rank, world))
    return out


results = on_ranks(_on_ranks, 2, 4, timeout=30)


def test_defaults_reshard_all_but_the_root_as_torch(results: list[dict]) -> None:
    for r in results:
        assert r["resharded"] == [False, True, True]  # root first, then the blocks
        assert r["gathers ours"] == r["gathers torch"] == 5  # root once, blocks twice
        assert r["defaults trained"] <= TRAIN_TOL
        assert r["ints"] == [False] * 3 + [True] * 3


def test_mixed_precision_equals_torchs(results: list[dict]) -> None:
    for r in results:
        assert r["mp loss"] <= GRAD_TOL
        assert r["mp grads"] <= GRAD_TOL
        assert r["mp one process"] <= BF16_TOL
        assert r["mp one process"] > GRAD_TOL  # bf16's rounding shows
        assert r["mp kept"] == ["torch.float32"]
        sent, want = r["mp step bytes"]
        assert sent == want


def test_no_sync_sends_once_and_equals_one_process(results: list[dict]) -> None:
    for r in results:
        assert r["scatters ours"] == r["units"] == 3
        assert r["no sync one process"] <= GRAD_TOL
        assert r["no sync torch"] <= GRAD_TOL


def test_clip_grad_norm_over_shards(results: list[dict]) -> None:
    for r in results:
        assert r["clip norm"] > 0.1 * 2  # clipping acts
        assert r["clip norm one process"] <= GRAD_TOL
        assert r["clip norm torch"] <= GRAD_TOL
        assert r["clip grads one process"] <= GRAD_TOL
        assert r["clip grads torch"] <= GRAD_TOL


def test_hsdp_2x2_equals_one_process_and_torch(results: list[dict]) -> None:
    if results[0]["world"] != 4:
        pytest.skip("HSDP runs on 4 ranks")
    for r in results:
        assert r["hsdp grads"] <= GRAD_TOL
        assert r["hsdp one process"] <= TRAIN_TOL
        assert r["hsdp torch"] <= TRAIN_TOL
    # sharded over 2 (the shard dim), replicated over the other: rank 0 = rank 2
    assert results[0]["hsdp pieces"] == results[2]["hsdp pieces"]
    assert results[0]["hsdp pieces"][0] == (5, 6)


def test_reshard_to_a_smaller_group(results: list[dict]) -> None:
    if results[0]["world"] != 4:
        pytest.skip("a group of 2 inside 4 ranks")
    for r in results:
        # each unit: forward over 4, backward over 2 (the root too: an int is for all)
        assert r["pair gathers"] == [2, 2, 2, 4, 4, 4]
        sent, want = r["pair bytes"]
        assert sent == want
        assert r["pair one process"] <= TRAIN_TOL
        assert r["pair torch"] <= TRAIN_TOL


def _bad_calls() -> dict:
    world = dist.get_world_size()
    errors: dict = {}
    cube = init_device_mesh(runtime.device().type, (1, 2, world // 2))
    row = init_device_mesh(runtime.device().type, (1, world))
    grid = init_device_mesh(runtime.device().type, (2, world // 2))
    cases = {
        "3-D mesh": lambda: fsdp.fully_shard(Net(), mesh=cube),
        "reshard 3": lambda: fsdp.fully_shard(Net(), reshard_after_forward=3),
        "reshard str": lambda: fsdp.fully_shard(Net(), reshard_after_forward="no"),
        "reshard 2 in HSDP": lambda: fsdp.fully_shard(
            Net(), mesh=row, reshard_after_forward=2
        ),
        "int dtype": lambda: fsdp.fully_shard(
            Net(), mp_policy=fsdp.MixedPrecisionPolicy(param_dtype=torch.int8)
        ),
        "not a policy": lambda: fsdp.fully_shard(Net(), mp_policy="bf16"),
        "uncast": lambda: fsdp.fully_shard(
            Net(), mp_policy=TorchPolicy(cast_forward_inputs=False)
        ),
        "HSDP checkpoint": lambda: fsdp.model_state(_shard(Net(), mesh=grid)),
        "sync str": lambda: _shard(Net()).set_requires_gradient_sync("no"),
        "clip 1-norm": lambda: fsdp.clip_grad_norm_(_shard(Net()), 1.0, 1.0),
        "clip no units": lambda: fsdp.clip_grad_norm_(Net(), 1.0),
    }
    for name, call in cases.items():
        try:
            call()
        except ValueError as err:
            errors[name] = str(err)
    return errors


BAD_CALLS = {  # a case of _bad_calls -> the words of its error
    "3-D mesh": "1-D (shard) or 2-D (replicate, shard), got 3-D",
    "reshard 3": "must divide the shard size 4",
    "reshard 2 in HSDP": "only on a 1-D mesh of the whole world",
    "reshard str": "must be a bool, an int or None",
    "int dtype": "param_dtype must be a floating dtype",
    "not a policy": "must be a MixedPrecisionPolicy",
    "uncast": "cast_forward_inputs=False is not supported",
    "HSDP checkpoint": "HSDP (a 2-D mesh) is not supported here",
    "sync str": "requires must be a bool",
    "clip 1-norm": "only the 2-norm",
    "clip no units": "no fully_shard units",
}


def test_bad_arguments_are_refused_before_any_collective() -> None:
    errors = spawn(_bad_calls, 4, timeout=30)
    assert all(e == errors[0] for e in errors)
    assert len(errors[0]) == len(BAD_CALLS) == 11, errors[0]
    assert_says(errors[0], BAD_CALLS)

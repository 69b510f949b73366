"""Negative controls for chapter 9's FSDP2 semantics: defaults, mixed precision,
accumulation without sync, clip_grad_norm_ and HSDP, each beside torch's.

One spawn of 4 ranks (the chapter's count) runs the chapter's checks with a fault
planted in ours, torch's and one process left right, and prints each verdict line
as the chapter does; every line must say FAIL or False. Faults: the root resharded
after forward; gradients reduced in bf16 (the policy's reduce_dtype ignored); every
gradient multiplied by the world size; the sync flag ignored (every micro-batch
reduce-scatters); a unit that drops its unsent gradients; the norm taken over this
rank's pieces alone (no all-reduce); HSDP's replicas never all-reduced; with
`reshard_after_forward=2`, the rows kept after forward lost, or the int ignored.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.nn.utils import clip_grad_norm_

from distcourse import checks, runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.mesh import Mesh
from distcourse.parallel import fsdp

WORLD = 4


def _sharded(shard: Callable | None = fsdp.fully_shard, **options: object) -> nn.Module:
    """The chapter's model: layers 0 and 2 as units, the root holding layer 4."""
    if shard is torch_fully_shard:
        options = {"mesh": fsdp.world_mesh(), **options}
    model = ex.uneven_mlp()
    for module in (model[0], model[2], model) if shard else ():
        shard(module, **options)
    return model


def _backward(
    model: nn.Module, ranks: object = None, rows: slice = slice(None), scale=1.0
) -> tuple[Ledger, float]:
    ranks = ranks or [torch.distributed.get_rank()]
    rows_of = [ex.batch(0, r) for r in ranks]
    x, y = (torch.cat(t)[rows] for t in zip(*rows_of, strict=True))
    with Ledger() as ledger:
        loss = ((model(x).float() - y) ** 2).mean() * scale
        loss.backward()
    return ledger, loss.item()


def _verdict(gap: float, tolerance: float) -> str:
    return checks.verdict(checks.max_over_ranks(gap), tolerance)


def _defaults_and_precision(lines: dict[str, str], one: dict[str, Tensor]) -> None:
    ours, theirs = _sharded(), _sharded(torch_fully_shard)
    fsdp.units(ours)[0].reshard_setting = True  # fault: the root resharded
    calls = [
        sum("gather" in r.op for r in _backward(m)[0].records) for m in (ours, theirs)
    ]
    lines["gathers"] = (
        f"{calls[0]} all-gathers a step, as torch's {calls[1]}: {calls[0] == calls[1]}"
    )
    bf16 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    ours = _sharded(mp_policy=MixedPrecisionPolicy(**bf16))
    theirs = _sharded(torch_fully_shard, mp_policy=MixedPrecisionPolicy(**bf16))
    for unit in fsdp.units(ours):
        unit.reduce_dtype = torch.bfloat16  # fault: reduce_dtype ignored
    losses = [_backward(model)[1] for model in (ours, theirs)]
    gap = max(abs(losses[0] - losses[1]), fsdp.gradient_gap(ours, theirs))
    lines["mp torch"] = (
        "bf16 params, fp32 reduce: max |ours - torch's| loss and gradients "
        + _verdict(gap, 1e-6)
    )
    summed = _sharded(mp_policy=MixedPrecisionPolicy(**bf16))
    _backward(summed, scale=WORLD)  # fault: every gradient WORLD times too large
    gap = _verdict(fsdp.gradient_gap(summed, one), 1e-2)
    lines["mp one"] = f"bf16 gradients: max |ours - fp32 one process| {gap}"


def _accumulated(model: nn.Module) -> int:
    """The chapter's two micro-batches, the second syncing; reduce-scatters sent."""
    sent = 0
    for half in (0, 1):
        model.set_requires_gradient_sync(half == 1)
        ledger, _ = _backward(model, rows=slice(2 * half, 2 * half + 2), scale=0.5)
        sent += sum(r.op.startswith("reduce") for r in ledger.records)
    return sent


def _no_sync(lines: dict[str, str], one: dict[str, Tensor]) -> None:
    ignored, theirs = _sharded(), _sharded(torch_fully_shard)
    ignored.set_requires_gradient_sync = lambda requires: None  # fault: ignored
    sent = {"ours": _accumulated(ignored), "torch": _accumulated(theirs)}
    once = sent["ours"] == sent["torch"] == len(fsdp.units(ignored))
    lines["once"] = f"one per unit, as torch's: {once}"
    dropping = _sharded()
    free = fsdp.Unit.free

    def dropped(unit: fsdp.Unit) -> None:  # fault: unsent gradients dropped
        if not unit.sync:
            for leaf in unit.full:
                leaf.grad = None
        free(unit)

    fsdp.Unit.free = dropped
    try:
        _accumulated(dropping)
    finally:
        fsdp.Unit.free = free
    for what, ref in (("one process", one), ("torch's", theirs)):
        gap = _verdict(fsdp.gradient_gap(dropping, ref), 1e-6)
        lines[f"no sync {what}"] = (
            f"accumulated without sync: max |ours - {what}| {gap}"
        )


def _clip(lines: dict[str, str]) -> None:
    ours, theirs, one = _sharded(), _sharded(torch_fully_shard), _sharded(None)
    _backward(ours), _backward(theirs), _backward(one, range(WORLD))
    real = fsdp.grads.dist
    fsdp.grads.dist = types.SimpleNamespace(all_reduce=lambda *a, **k: None)  # fault
    try:
        norm = fsdp.clip_grad_norm_(ours, max_norm=0.1)
    finally:
        fsdp.grads.dist = real
    their_norm = clip_grad_norm_(theirs.parameters(), max_norm=0.1).full_tensor()
    one_norm = clip_grad_norm_(one.parameters(), max_norm=0.1)
    clipped = {name: p.grad for name, p in one.named_parameters()}
    refs = {"one process": (one_norm, clipped), "torch's": (their_norm, theirs)}
    for what, (n, ref) in refs.items():
        gap = _verdict(max(abs(norm - n).item(), fsdp.gradient_gap(ours, ref)), 1e-6)
        lines[f"clip {what}"] = (
            f"clip_grad_norm_ to 0.1: max |ours - {what}| norm and gradients {gap}"
        )


def _hsdp(lines: dict[str, str]) -> None:
    rank = torch.distributed.get_rank()
    grid = Mesh((2, 2), ("replicate", "shard")).device_mesh
    ours = _sharded(mesh=grid)
    theirs = _sharded(torch_fully_shard, mesh=grid)
    for unit in fsdp.units(ours):
        unit.replicate = None  # fault: each replica averages its own rows only
    for model in (ours, theirs):
        ex.train(model, ex.optimizer("SGD", model.parameters()), rank)
    full = fsdp.full_state_dict(ours)
    diff = ex.max_difference(full, ex.one_process(WORLD, "SGD"))
    lines["hsdp one"] = (
        f"HSDP 2x2 SGD: max |4 ranks - one process| {_verdict(diff, 1e-5)}"
    )
    options = StateDictOptions(full_state_dict=True)
    diff = ex.max_difference(full, get_model_state_dict(theirs, options=options))
    lines["hsdp torch"] = f"HSDP 2x2 SGD: max |ours - torch's| {_verdict(diff, 1e-5)}"


def _pairs(lines: dict[str, str]) -> None:
    """reshard_after_forward=2 with the rows kept after forward zeroed (the gather
    before backward brings zeros), and with the int ignored (backward over 4)."""
    rank = torch.distributed.get_rank()
    zeroed = _sharded(reshard_after_forward=2)

    def zero_kept(*_: object) -> None:  # fault: the kept rows lost
        for unit in fsdp.units(zeroed):
            if unit.kept is not None:
                unit.kept.zero_()

    for module in (zeroed[0], zeroed[2], zeroed):
        module.register_forward_hook(zero_kept)
    ex.train(zeroed, ex.optimizer("SGD", zeroed.parameters()), rank)
    full, ref = fsdp.full_state_dict(zeroed), ex.one_process(WORLD, "SGD")
    verdict = _verdict(ex.max_difference(full, ref), 1e-5)
    lines["pairs"] = (
        f"reshard_after_forward=2 SGD: max |4 ranks - one process| {verdict}"
    )
    ignored = _sharded(reshard_after_forward=2)
    for unit in fsdp.units(ignored):
        unit.smaller = None  # fault: the int ignored, resharded over all 4
    sizes = [r.group_size for r in _backward(ignored)[0].records if "gather" in r.op]
    lines["pair sizes"] = (
        f"its gathers before backward over 2 ranks, not 4: {sizes[3:] == [2] * 3}"
    )


def _faults() -> dict[str, str]:
    torch.set_num_threads(1)
    runtime.require_initialized()
    one_model = _sharded(None)
    _backward(one_model, range(WORLD))
    one = {name: p.grad.clone() for name, p in one_model.named_parameters()}
    lines: dict[str, str] = {}
    _defaults_and_precision(lines, one)
    _no_sync(lines, one)
    _clip(lines)
    _hsdp(lines)
    _pairs(lines)
    return lines


@pytest.fixture(scope="module")
def lines() -> dict[str, str]:
    return spawn(_faults, WORLD, timeout=30)[0]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"\d+ all-gathers a step, as torch's \d+",
    fault="ours resharding the root after forward (torch's default keeps it)",
)
def test_a_resharded_root_fails_torchs_gather_count(lines: dict[str, str]) -> None:
    assert lines["gathers"].endswith("False"), lines["gathers"]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"bf16 params, fp32 reduce: max \|ours - torch's\|",
    fault="ours reducing gradients in bf16 (the policy's reduce_dtype ignored)",
)
@pytest.mark.controls(
    "09_zero_fsdp",
    r"bf16 gradients: max \|ours - fp32 one process\|",
    fault="every gradient multiplied by the world size (summed, not averaged)",
)
def test_a_faulty_mixed_precision_fails(lines: dict[str, str]) -> None:
    for name in ("mp torch", "mp one"):
        assert lines[name].endswith("FAIL"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"one per unit, as torch's",
    fault="set_requires_gradient_sync ignored: every micro-batch reduce-scatters",
)
@pytest.mark.controls(
    "09_zero_fsdp",
    r"accumulated without sync: max \|ours - (one process|torch's)\|",
    fault="a unit that drops its unsent gradients instead of keeping them",
)
def test_a_faulty_accumulation_fails(lines: dict[str, str]) -> None:
    assert lines["once"].endswith("False"), lines["once"]
    for name in ("no sync one process", "no sync torch's"):
        assert lines[name].endswith("FAIL"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"clip_grad_norm_ to 0\.1: max \|ours - (one process|torch's)\|",
    fault="the norm taken over this rank's pieces alone, never all-reduced",
)
def test_a_local_norm_fails(lines: dict[str, str]) -> None:
    for name in ("clip one process", "clip torch's"):
        assert lines[name].endswith("FAIL"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"HSDP 2x2 SGD: max \|(4 ranks - one process|ours - torch's)\|",
    fault="HSDP's replicas never all-reduced: each averages its own rows only",
)
def test_unreduced_replicas_fail(lines: dict[str, str]) -> None:
    for name in ("hsdp one", "hsdp torch"):
        assert lines[name].endswith("FAIL"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"reshard_after_forward=2 SGD: max \|4 ranks - one process\|",
    fault="the rows each rank keeps after forward lost (zeroed) before backward",
)
@pytest.mark.controls(
    "09_zero_fsdp",
    r"its gathers before backward over 2 ranks, not 4",
    fault="the int ignored: every unit resharded over all 4 ranks",
)
def test_a_faulty_smaller_group_fails(lines: dict[str, str]) -> None:
    assert lines["pairs"].endswith("FAIL"), lines["pairs"]
    assert lines["pair sizes"].endswith("False"), lines["pair sizes"]

"""Our DDP takes torch's constructor arguments: same names, order and defaults, and
each one implemented (same effect, checked on real gloo ranks), accepted with no
effect (as in torch), or refused with an error that says why."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from distcourse import runtime
from distcourse.examples import models
from distcourse.examples.datasets import synthetic_regression
from distcourse.launch import spawn
from distcourse.parallel import compat
from distcourse.parallel.ddp import DDP


def test_signature_is_torchs_argument_for_argument() -> None:
    theirs = inspect.signature(DistributedDataParallel.__init__).parameters
    ours = inspect.signature(DDP.__init__).parameters
    positional = [p for p in ours.values() if p.kind != p.KEYWORD_ONLY]
    assert [p.name for p in positional] == list(theirs)
    for p in positional:
        assert p.default == theirs[p.name].default, p.name
    assert [p.name for p in ours.values() if p.kind == p.KEYWORD_ONLY] == [
        "check_equal", "group",
    ]  # fmt: skip


def _options(module: nn.Module | None = None, **given: object) -> compat.DDPOptions:
    """Resolve arguments as DDP.__init__ would: torch's defaults, then `given`."""
    args = {
        name: p.default
        for name, p in inspect.signature(DDP.__init__).parameters.items()
        if name not in ("self", "module")
    }
    return compat.ddp_options(module or nn.Linear(2, 2), **{**args, **given})


@pytest.mark.parametrize("name", sorted(compat.REFUSED))
def test_arguments_that_would_change_results_are_refused(name: str) -> None:
    value = [1] if name == "bucket_cap_mb_list" else True
    with pytest.raises(NotImplementedError, match=f"DDP: {name} is not supported"):
        _options(**{name: value})


def test_device_rules_are_torchs() -> None:
    with pytest.raises(ValueError, match="only work with single-device GPU modules"):
        _options(device_ids=[0])  # a CPU module, as torch refuses too
    with pytest.raises(ValueError, match="output_device needs device_ids"):
        _options(output_device=0)
    with pytest.raises(ValueError, match="single element"):
        _options(device_ids=[0, 1])
    with pytest.raises(ValueError, match="one of process_group, group"):
        _options(process_group=object(), group=object())
    assert _options(device_ids=[]).device is None  # torch accepts [] as None


def test_defaults_and_accepted_arguments() -> None:
    opts = _options(dim=1, check_reduction=True, batched_grad_copy=True)
    assert (opts.bucket_cap_mb, opts.dim) == (25.0, 1)
    assert opts.forward_sync_buffers and opts.init_sync_buffers
    off = _options(broadcast_buffers=False)
    assert not off.forward_sync_buffers and not off.init_sync_buffers
    new = _options(forward_sync_buffers=False)  # torch: still syncs at init
    assert not new.forward_sync_buffers and new.init_sync_buffers
    assert _options(static_graph=True).find_unused_parameters


def test_to_device_moves_nested_tensors() -> None:
    x = torch.ones(2, dtype=torch.float64)
    moved = compat.to_device(([x], {"a": (x, 3)}), torch.device("meta"))
    assert moved[0][0].device.type == "meta" and moved[1]["a"][1] == 3


def _train(**options: object) -> dict:
    """3 steps of the toy model on each rank's data, one step under no_sync."""
    rank = runtime.require_initialized().rank
    torch.manual_seed(rank)  # different initial weights: DDP must copy rank 0's
    model = models.toy_mlp(d_hidden=32)
    ddp = DDP(model, bucket_cap_mb=0.001, **options)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = synthetic_regression(12, seed=rank)
    for step in range(3):
        opt.zero_grad()
        if step == 1:
            with ddp.no_sync():
                F.mse_loss(ddp(x[:4]), y[:4]).backward()
        F.mse_loss(ddp(x[4:]), y[4:]).backward()
        opt.step()
    buffers = [b.buffer.untyped_storage().data_ptr() for b in ddp.buckets]
    in_buckets = [
        p.grad.untyped_storage().data_ptr() in buffers for p in model.parameters()
    ]
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "in_buckets": in_buckets,
        "keys": list(ddp.state_dict()),
        "torch_keys": list(DistributedDataParallel(models.toy_mlp()).state_dict()),
    }


def _train_both() -> tuple[dict, dict]:
    return _train(), _train(gradient_as_bucket_view=True)


def test_gradient_as_bucket_view_same_numbers_without_the_copy() -> None:
    for copied, viewed in spawn(_train_both, 2):
        assert not any(copied["in_buckets"]) and all(viewed["in_buckets"])
        for a, b in zip(copied["params"], viewed["params"], strict=True):
            assert torch.equal(a, b)
        assert copied["keys"] == copied["torch_keys"]  # "module.0.weight", ...


def _init_sync_off() -> tuple[list, list]:
    rank = runtime.require_initialized().rank
    torch.manual_seed(rank)
    kept = nn.BatchNorm1d(3)
    kept.running_mean.fill_(rank)
    DDP(kept, init_sync=False)
    synced = nn.BatchNorm1d(3)
    synced.running_mean.fill_(rank)
    DDP(synced, broadcast_buffers=False)  # parameters copied, buffers not
    return [kept.weight.detach(), kept.running_mean], [synced.running_mean]


def test_init_sync_false_and_broadcast_buffers_false_leave_ranks_as_they_are() -> None:
    ranks = spawn(_init_sync_off, 2)
    assert [r[0][1][0].item() for r in ranks] == [0.0, 1.0]
    assert [r[1][0][0].item() for r in ranks] == [0.0, 1.0]

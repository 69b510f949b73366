"""Our DDP takes torch's constructor arguments: same names, order and defaults, and
each one implemented (same effect, checked on real gloo ranks), accepted with no
effect (as in torch), or refused with an error that says why."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from spawned import on_ranks
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    fp16_compress_hook,
)
from torch.nn.parallel import DistributedDataParallel

from distcourse import runtime
from distcourse.comm import ring_all_reduce
from distcourse.examples import models
from distcourse.examples.datasets import synthetic_regression
from distcourse.launch import spawn
from distcourse.parallel import compat
from distcourse.parallel.ddp import DDP


def test_signature_is_torchs_argument_for_argument() -> None:
    theirs = inspect.signature(DistributedDataParallel.__init__).parameters
    ours = inspect.signature(DDP.__init__).parameters
    positional = [p for p in ours.values() if p.kind != p.KEYWORD_ONLY]
    names = [p.name for p in positional]
    # ours is the newest supported torch's; an older torch (2.11) lacks the last two
    # and defaults broadcast_buffers to True, what our None means without them
    newer = [
        n for n in ("batched_grad_copy", "forward_sync_buffers") if n not in theirs
    ]
    assert names == [*theirs, *newer]
    for p in positional[: len(theirs)]:
        want = theirs[p.name].default
        if p.name == "broadcast_buffers" and newer and want is True:
            want = None  # resolved to True while forward_sync_buffers is None
        assert p.default == want, p.name
    assert [p.name for p in ours.values() if p.kind == p.KEYWORD_ONLY] == [
        "check_equal",
        "group",
    ]


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


# ---------------------------------------------------------------- comm hooks -------
# register_comm_hook as torch's: the hook gets the bucket's plain sum of gradients
# (not divided by N), averages and sends it itself, and returns a Future of the new
# flat tensor. torch's own hooks must give our DDP torch's numbers, bit for bit.

HOOK_STEPS, HOOK_CAP_MB = 3, 600 / 2**20  # two buckets of toy_mlp(10, 32, 5)
Hook = Callable[[object, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def _typed(hook: Hook) -> Hook:
    """Annotations as classes, not strings: torch (and ours) check them against
    dist.GradBucket and torch.futures.Future[torch.Tensor]."""
    hook.__annotations__ = typing.get_type_hints(hook)
    return hook


@_typed
def _noop(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


@_typed
def _ring(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's average, sent by our ring all-reduce instead of gloo's."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(ring_all_reduce(bucket.buffer().div_(dist.get_world_size())))
    return future


def _hooked(
    kind: str, hook: Hook | None, steps: int = HOOK_STEPS
) -> list[torch.Tensor]:
    """Parameters after `steps` SGD steps (just the gradients if steps == 0)."""
    rank = runtime.require_initialized().rank
    torch.manual_seed(0)
    model = models.toy_mlp(d_in=10, d_hidden=32, d_out=5)
    wrap = DDP if kind == "ours" else DistributedDataParallel
    net = wrap(model, bucket_cap_mb=HOOK_CAP_MB)
    if hook is not None:
        net.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = synthetic_regression(8 * max(steps, 1), d_in=10, d_out=5, seed=rank)
    for xb, yb in zip(x.split(8), y.split(8), strict=True):
        opt.zero_grad()
        F.mse_loss(net(xb), yb).backward()
        if steps == 0:
            return [p.grad.clone() for p in model.parameters()]
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _hook_runs() -> dict:
    sizes: list[tuple[int, bool, int, bool]] = []

    @_typed
    def record(
        state: object, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        grads, params, buffer = bucket.gradients(), bucket.parameters(), bucket.buffer()
        views = all(g.shape == p.shape for g, p in zip(grads, params, strict=True))
        inside = all(
            g.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            for g in grads
        )
        sizes.append(
            (bucket.index(), bucket.is_last(), buffer.numel(), views and inside)
        )
        return allreduce_hook(state, bucket)

    runs = {"plain": _hooked("ours", None), "ring": _hooked("ours", _ring)}
    _hooked("ours", record, steps=1)
    runs["sizes"] = sizes
    net = DDP(models.toy_mlp(d_in=10, d_hidden=32, d_out=5), bucket_cap_mb=HOOK_CAP_MB)
    runs["layout"] = [[b.index, b.buffer.numel()] for b in net.buckets]
    for kind in ("ours", "torch"):
        for name, hook in {
            "allreduce": allreduce_hook,
            "fp16": fp16_compress_hook,
        }.items():
            runs[kind, name] = _hooked(kind, hook)
        runs[kind, "noop"] = _hooked(kind, _noop, steps=0)
    runs["average"] = _hooked("ours", None, steps=0)
    return runs


hook_runs = on_ranks(_hook_runs, 2)


def test_torchs_hooks_give_torchs_numbers_bit_for_bit(hook_runs: list[dict]) -> None:
    for runs in hook_runs:
        for name in ("allreduce", "fp16", "noop"):
            for ours, theirs in zip(
                runs["ours", name], runs["torch", name], strict=True
            ):
                assert torch.equal(ours, theirs), name
        for ours, plain in zip(runs["ours", "allreduce"], runs["plain"], strict=True):
            assert torch.equal(ours, plain)  # allreduce_hook averages once, not twice
    assert not all(  # fp16 compression did change the numbers (so was used)
        torch.equal(a, b)
        for a, b in zip(
            hook_runs[0]["ours", "fp16"], hook_runs[0]["plain"], strict=True
        )
    )


def test_noop_hook_sees_the_local_gradients_undivided(hook_runs: list[dict]) -> None:
    for runs in hook_runs:  # not divided by N (torch's warning), not summed ...
        for got, average in zip(runs["ours", "noop"], runs["average"], strict=True):
            assert not torch.equal(got, average)
    rank0, rank1 = (runs["ours", "noop"] for runs in hook_runs)
    for a, b, avg in zip(rank0, rank1, hook_runs[0]["average"], strict=True):
        assert torch.allclose((a + b) / 2, avg, atol=1e-6)  # ... DDP averages these


def test_a_hook_sees_each_bucket_once_per_backward(hook_runs: list[dict]) -> None:
    for runs in hook_runs:
        sizes = runs["sizes"]
        # a 600-byte cap, last layer first: Linear(32, 5) = 165 floats, Linear(10, 32)
        assert (
            [[i, n] for i, _, n, _ in sizes] == runs["layout"] == [[0, 165], [1, 352]]
        )
        assert [last for _, last, _, _ in sizes] == [False, True]
        assert all(views for *_, views in sizes)  # gradients() views of buffer()


def test_a_hook_through_our_ring_all_reduce_gives_ddps_numbers(
    hook_runs: list[dict],
) -> None:
    for runs in hook_runs:
        for ring, plain in zip(runs["ring"], runs["plain"], strict=True):
            assert torch.allclose(ring, plain, atol=1e-6)


def _registration_errors() -> list[str]:
    errors = []
    for attempt in ("twice", "after backward", "annotation", "not callable"):
        net = DDP(models.toy_mlp())
        try:
            if attempt == "twice":
                net.register_comm_hook(None, allreduce_hook)
                net.register_comm_hook(None, allreduce_hook)
            elif attempt == "after backward":
                net(torch.ones(2, 10)).sum().backward()
                net.register_comm_hook(None, allreduce_hook)
            elif attempt == "annotation":
                net.register_comm_hook(None, _wrong_annotation)
            else:
                net.register_comm_hook(None, "allreduce")
        except (RuntimeError, ValueError, TypeError) as error:
            errors.append(f"{type(error).__name__}: {error}")
    return errors


def _wrong_annotation(state: object, bucket: torch.Tensor) -> None:
    return None


def test_registration_errors_are_torchs() -> None:
    assert spawn(_registration_errors, 1)[0] == [
        "RuntimeError: register_comm_hook or register_builtin_comm_hook can only "
        "be called once.",
        "RuntimeError: DDP: register_comm_hook must be called before the first "
        "backward",
        "ValueError: Communication hook: bucket annotation should be dist.GradBucket.",
        "TypeError: Communication hook must be callable.",
    ]

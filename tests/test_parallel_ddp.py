"""Data parallelism on real gloo ranks: equal to one process, buckets, edge cases.

Tolerance: ranks sum gradients in another order than one process does, so float32
results agree to ATOL = 1e-6 (absolute, rtol 0) rather than bit for bit; with 2 ranks
a sum of two numbers has one order only, so bucket layouts must agree exactly.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from distcourse import runtime
from distcourse.examples import models
from distcourse.examples.datasets import synthetic_regression
from distcourse.launch import spawn
from distcourse.parallel.buckets import assign_buckets
from distcourse.parallel.ddp import DDP, average_gradients, partition
from distcourse.trace import hidden_fraction

ATOL = 1e-6
B, STEPS, LR = 16, 3, 0.1  # global batch, optimizer steps, SGD learning rate


def _model() -> nn.Module:
    torch.manual_seed(0)
    return models.toy_mlp(d_in=10, d_hidden=32, d_out=5)


def _dataset() -> TensorDataset:
    return TensorDataset(*synthetic_regression(B * STEPS, d_in=10, d_out=5, seed=1))


def _one_process() -> tuple[list[torch.Tensor], list[float]]:
    """SGD on the full batch B in this process: the result every rank must match."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in DataLoader(_dataset(), batch_size=B):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach() for p in model.parameters()], losses


def _train(kind: str, bucket_cap_mb: float = 25.0) -> tuple[list, list[float]]:
    """On each rank: STEPS steps on this rank's strided share of each global batch."""
    world = runtime.require_initialized().world_size
    model = _model()
    net = model
    if kind == "ours":
        net = DDP(model, bucket_cap_mb=bucket_cap_mb)
    elif kind == "torch":
        net = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in DataLoader(partition(_dataset()), batch_size=B // world):
        opt.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        if kind == "naive":
            average_gradients(model)
        opt.step()
        losses.append(loss.item())
    return [p.detach() for p in model.parameters()], losses


def _train_all_kinds() -> dict:
    return {kind: _train(kind) for kind in ("naive", "ours", "torch")}


@pytest.mark.parametrize("world", [2, 4])
def test_equal_to_one_process(world: int) -> None:
    expected, full_losses = _one_process()
    by_rank = spawn(_train_all_kinds, world)
    for rank, results in enumerate(by_rank):
        for kind, (params, _) in results.items():
            for got, want in zip(params, expected, strict=True):
                torch.testing.assert_close(
                    got, want, atol=ATOL, rtol=0, msg=f"{kind} rank {rank}"
                )
        ours, theirs = results["ours"][1], results["torch"][1]
        assert ours == pytest.approx(theirs, abs=ATOL, rel=0)
    # equal shards: the mean of the ranks' losses is the one-process loss
    mean = torch.tensor([r["ours"][1] for r in by_rank]).mean(0)
    assert mean.tolist() == pytest.approx(full_losses, abs=ATOL, rel=0)


# ------------------------------------------------------------------ buckets --------


def test_assign_buckets_reverse_order_and_cap() -> None:
    params = list(_model().parameters())  # 32x10, 32, 5x32, 5 floats
    assert assign_buckets(params, cap_bytes=1) == [[3], [2], [1], [0]]
    assert assign_buckets(params, cap_bytes=2**30) == [[3, 2, 1, 0]]
    # 5 + 160 floats = 660 bytes reach the cap; then 32 + 320 floats
    assert assign_buckets(params, cap_bytes=600) == [[3, 2], [1, 0]]


CAPS_MB = (1e-6, 600 / 2**20, 1e3)  # one parameter per bucket, two, all in one


def _bucket_runs() -> dict[float, tuple[list, list[list[int]]]]:
    """Per cap: the trained parameters, and each bucket's parameter indices."""
    results = {}
    for cap in CAPS_MB:
        model = _model()
        index = {id(p): i for i, p in enumerate(model.parameters())}
        layout = [
            [index[id(p)] for p in b.params]
            for b in DDP(model, bucket_cap_mb=cap).buckets
        ]
        results[cap] = (_train("ours", bucket_cap_mb=cap)[0], layout)
    return results


@pytest.fixture(scope="module")
def bucket_runs() -> dict:
    return spawn(_bucket_runs, 2)[0]


def test_buckets_fill_in_reverse_parameter_order(bucket_runs: dict) -> None:
    layouts = [layout for _, layout in bucket_runs.values()]
    assert layouts == [[[3], [2], [1], [0]], [[3, 2], [1, 0]], [[3, 2, 1, 0]]]


def test_bucket_sizes_give_identical_results(bucket_runs: dict) -> None:
    first = bucket_runs[CAPS_MB[0]][0]
    for params, _ in bucket_runs.values():
        for got, want in zip(params, first, strict=True):
            assert torch.equal(got, want)  # 2 ranks: a + b has one order only


@pytest.mark.parametrize("cap", [0, -1.0])
def test_bucket_cap_must_be_positive(cap: float) -> None:
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        DDP(_model(), bucket_cap_mb=cap)  # raised before any collective


# ------------------------------------------------- accumulation, unused, errors ----


def _accumulate() -> tuple[list, list[bool]]:
    """Each rank: two micro-batches per step, the first under no_sync()."""
    world = runtime.require_initialized().world_size
    model = _model()
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    talked = []  # did the no_sync backward start any all-reduce?
    for x, y in DataLoader(partition(_dataset()), batch_size=B // world):
        (x0, x1), (y0, y1) = x.chunk(2), y.chunk(2)
        opt.zero_grad()
        with ddp.no_sync():
            (F.mse_loss(ddp(x0), y0) / 2).backward()
        talked.append(any(e.name.startswith("all_reduce") for e in ddp.timeline))
        (F.mse_loss(ddp(x1), y1) / 2).backward()
        opt.step()
    return [p.detach() for p in model.parameters()], talked


def test_no_sync_accumulation_equals_large_batch() -> None:
    expected, _ = _one_process()
    for params, talked in spawn(_accumulate, 2):
        assert not any(talked)
        for got, want in zip(params, expected, strict=True):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


class TwoHeads(nn.Module):
    """A body and two heads; `extra` joins the output only when asked to."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(4, 8)
        self.head, self.extra = nn.Linear(8, 2), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        h = torch.relu(self.body(x))
        return self.head(h) + self.extra(h) if use_extra else self.head(h)


def _head_batch(rank: int) -> torch.Tensor:
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(rank))


def _unused(uses: list[bool], find_unused: bool) -> list | str:
    """Each rank: two backward passes, using `extra` if uses[rank]; its grads."""
    rank = runtime.require_initialized().rank
    model = TwoHeads()
    ddp = DDP(model, find_unused_parameters=find_unused)
    try:
        for _ in range(2):  # the second pass checks that state was reset
            model.zero_grad()
            ddp(_head_batch(rank), uses[rank]).square().mean().backward()
    except RuntimeError as err:
        return str(err)
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("uses", [[False, False], [True, False]])
def test_unused_parameters_are_handled(uses: list[bool]) -> None:
    model = TwoHeads()  # one process: the mean of the two ranks' losses
    losses = [model(_head_batch(r), u).square().mean() for r, u in enumerate(uses)]
    (sum(losses) / 2).backward()
    for grads in spawn(_unused, 2, uses, True):
        for got, p in zip(grads, model.parameters(), strict=True):
            if p.grad is None:  # unused on every rank: stays None, as in torch
                assert got is None
            else:
                torch.testing.assert_close(got, p.grad, atol=ATOL, rtol=0)


def test_unused_parameter_without_find_unused_raises_on_every_rank() -> None:
    for message in spawn(_unused, 2, [False, False], False):
        assert "extra.weight" in message and "find_unused_parameters" in message


def _wrap_mismatched() -> dict:
    """Each rank wraps models that disagree across ranks; collect the errors."""
    rank = runtime.require_initialized().rank
    models_by_case = {
        "shape": lambda: (nn.Linear(4, 4 + rank), {}),
        "count": lambda: (
            nn.Sequential(*[nn.Linear(4, 4) for _ in range(1 + rank)]),
            {},
        ),
        "values": lambda: (nn.Linear(4, 4), dict(check_equal=True)),
    }
    errors = {}
    for case, make in models_by_case.items():
        torch.manual_seed(rank)  # different initial values on every rank
        model, options = make()
        try:
            DDP(model, **options)
            errors[case] = None
        except ValueError as err:
            errors[case] = str(err)
    torch.manual_seed(rank)
    copied = nn.Linear(4, 4)
    DDP(copied)  # check_equal=False: rank 0's values win
    errors["copied"] = [p.detach() for p in copied.parameters()]
    torch.manual_seed(0)
    DDP(nn.Linear(4, 4), check_equal=True)  # equal values: no error
    return errors


def test_models_that_differ_across_ranks_raise_on_every_rank() -> None:
    by_rank = spawn(_wrap_mismatched, 2)
    for errors in by_rank:
        assert "'weight' (4, 4)" in errors["shape"] and "(5, 4)" in errors["shape"]
        assert "rank 0 has 2 parameters, rank 1 has 4" in errors["count"]
        assert "'weight' differs across ranks" in errors["values"]
    for a, b in zip(by_rank[0]["copied"], by_rank[1]["copied"], strict=True):
        assert torch.equal(a, b)


def _wrap_wrong_shape() -> None:
    DDP(nn.Linear(4, 4 + runtime.require_initialized().rank))


def test_mismatch_reaches_the_caller_as_rank_error() -> None:
    with pytest.raises(runtime.RankError, match="ValueError"):
        spawn(_wrap_wrong_shape, 2)


def _step_without_backward() -> tuple[bool, bool, list]:
    model = _model()
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    opt.step()  # no backward: every grad is None, so SGD skips every parameter
    ddp.finish()  # nothing in flight: does nothing
    after = model.parameters()
    unchanged = all(torch.equal(a, p) for a, p in zip(before, after, strict=True))
    no_grads = all(p.grad is None for p in model.parameters())
    x, y = synthetic_regression(4, seed=runtime.require_initialized().rank)
    F.mse_loss(ddp(x), y).backward()  # and training still works afterwards
    opt.step()
    return unchanged, no_grads, [p.detach() for p in model.parameters()]


def test_optimizer_step_without_backward_changes_nothing() -> None:
    results = spawn(_step_without_backward, 2)
    for unchanged, no_grads, _ in results:
        assert unchanged and no_grads
    for a, b in zip(results[0][2], results[1][2], strict=True):
        assert torch.equal(a, b)


def _naive_with_missing_grad() -> tuple[list, list]:
    """Rank 0 computes gradients, rank 1 does not: average_gradients must not hang."""
    model = _model()
    x, y = synthetic_regression(4)
    if runtime.require_initialized().rank == 0:
        F.mse_loss(model(x), y).backward()
    local = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    average_gradients(model)
    return local, [p.grad for p in model.parameters()]


def test_average_gradients_treats_missing_grads_as_zeros() -> None:
    (local, grads0), (missing, grads1) = spawn(_naive_with_missing_grad, 2)
    assert all(g is None for g in missing)
    for g_local, g0, g1 in zip(local, grads0, grads1, strict=True):
        assert torch.equal(g0, g1)
        torch.testing.assert_close(g0, g_local / 2, atol=ATOL, rtol=0)


# ----------------------------------------------------------------- timeline --------


def _timeline(cap_mb: float = 1e-6) -> list[tuple[str, float, float]]:
    model = models.wide_mlp(width=256, depth=4, d_in=64)  # 8 parameters
    ddp = DDP(model, bucket_cap_mb=cap_mb)  # default: one bucket each
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    for _ in range(2):
        model.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
    return [(e.name, e.start, e.end) for e in ddp.timeline]


def test_timeline_shows_all_reduce_overlapping_backward() -> None:
    for timeline in spawn(_timeline, 2):
        spans = {name: (start, end) for name, start, end in timeline}
        buckets = [f"all_reduce {i}" for i in range(8)]
        assert set(spans) == {"forward", "backward", "wait", *buckets}
        assert all(start <= end for start, end in spans.values())
        backward_start, backward_end = spans["backward"]
        assert spans["forward"][1] <= backward_start
        launches = [spans[name][0] for name in buckets]
        assert launches == sorted(launches)  # bucket 0 (the last layer) goes first
        # backward ends with the last gradient (0.weight, bucket 7): every other
        # bucket starts while backward still computes, the last one after it
        assert all(backward_start <= t < backward_end for t in launches[:-1])
        assert backward_end <= launches[-1]
        assert spans["wait"][0] == backward_end
        assert all(spans[name][1] <= spans["wait"][1] for name in buckets)
        assert 0 <= hidden_fraction(timeline) < 1  # the last bucket: never hidden


def test_one_bucket_hides_nothing_behind_backward() -> None:
    for timeline in spawn(_timeline, 2, 1e3):  # every gradient in one bucket
        names = [name for name, _, _ in timeline]
        assert names.count("all_reduce 0") == 1 and "all_reduce 1" not in names
        assert hidden_fraction(timeline) == 0.0  # sent after the last gradient


# ---------------------------------------------------------------- partition --------


def test_partition_is_strided_disjoint_and_drops_the_remainder() -> None:
    data = TensorDataset(torch.arange(10))
    shares = [partition(data, rank, 4).indices for rank in range(4)]
    assert shares == [[0, 4], [1, 5], [2, 6], [3, 7]]  # 8, 9 dropped: equal shares


def test_partition_shuffles_alike_on_every_rank() -> None:
    data = TensorDataset(torch.arange(10))
    shares = [partition(data, rank, 2, shuffle_seed=3).indices for rank in range(2)]
    assert sorted(shares[0] + shares[1]) == list(range(10))
    assert shares[0] != [0, 2, 4, 6, 8]
    assert partition(data, 0, 2, shuffle_seed=4).indices != shares[0]


@pytest.mark.parametrize("rank, world, n", [(2, 2, 10), (0, 0, 10), (0, 4, 3)])
def test_partition_rejects_bad_arguments(rank: int, world: int, n: int) -> None:
    with pytest.raises(ValueError):
        partition(TensorDataset(torch.arange(n)), rank, world)

"""Negative controls of chapter 3: each verdict it prints, shown failing on a fault.

The chapter trains `digits_mlp` for one epoch on 4 ranks, by hand (average after
backward), with the cell's TinyDDP, our DDP and torch's, and checks the replicas,
the runs against each other and against one process, the bytes handed to
all-reduce and sent on the wire, and the sampler's shares. Here the same loops and
checks run on 4 ranks with one fault planted at a time, in one spawn; the sampler's
check needs no ranks.
"""

from __future__ import annotations

from collections.abc import Callable

import ddp_faults
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from distcourse import checks, runtime
from distcourse.comm import naive_all_reduce, ring_all_reduce
from distcourse.comm.ledger import Ledger
from distcourse.examples import datasets, models
from distcourse.launch import spawn
from distcourse.parallel import replicas
from distcourse.parallel.buckets import watch_torch_buckets
from distcourse.parallel.ddp import DDP, average_gradients, partition

WORLD, TOL = 4, 1e-6  # the chapter's ranks and tolerance


class TinyDDP(torch.nn.Module):
    """The chapter's TinyDDP; `divide=False` plants the fault: gradients summed."""

    def __init__(self, module: torch.nn.Module, divide: bool = True) -> None:
        super().__init__()
        self.module, self.pending, self.divide = module, [], divide
        for p in module.parameters():
            dist.broadcast(p.detach(), src=0)
            p.register_post_accumulate_grad_hook(self.send)

    def send(self, p: torch.nn.Parameter) -> None:
        if self.divide:
            p.grad /= dist.get_world_size()
        self.pending.append(dist.all_reduce(p.grad, async_op=True))

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.module(*args)

    def wait(self) -> None:
        for work in self.pending:
            work.wait()
        self.pending.clear()


def nothing(net: torch.nn.Module) -> None:
    """After backward, the DDPs need nothing more (TinyDDP waits)."""


def summed_gradients(model: torch.nn.Module) -> None:
    """average_gradients without its division: the by-hand loop's fault."""
    for p in model.parameters():
        dist.all_reduce(p.grad)


def all_but_the_last(model: torch.nn.Module) -> None:
    """average_gradients over every parameter but the last: one left out."""
    for p in list(model.parameters())[:-1]:
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def summing(wrap: Callable) -> Callable:
    """`wrap` (a DDP) with the comm hook that sums instead of averaging."""

    def wrapped(model: torch.nn.Module) -> torch.nn.Module:
        net = wrap(model)
        net.register_comm_hook(None, ddp_faults.summed_hook)
        return net

    return wrapped


def frozen_bias(wrap: Callable) -> Callable:
    """`wrap` (a DDP) of a model whose first bias is frozen: in no bucket."""

    def wrapped(model: torch.nn.Module) -> torch.nn.Module:
        model[1].bias.requires_grad_(False)
        return wrap(model)

    return wrapped


def ours(model: torch.nn.Module) -> torch.nn.Module:
    return DDP(model, bucket_cap_mb=0.002)  # the chapter's cap: several buckets


def theirs(model: torch.nn.Module) -> torch.nn.Module:
    return DistributedDataParallel(model)


def global_mean(loss: torch.Tensor) -> float:
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def train_share(share: Subset, wrap: Callable, after_backward: Callable = nothing):
    """The chapter's `train_share`: a fresh model, wrapped, one epoch of `share`."""
    runtime.seed_everything(0, per_rank=False)
    model = models.digits_mlp()
    net = wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x, y in DataLoader(share, batch_size=32):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        after_backward(net)
        optimizer.step()
        losses.append(global_mean(loss))
    return model, losses


def one_process(train_set: TensorDataset, used: int) -> torch.nn.Module:
    """The chapter's reference: one process, global batch 128, the ranks' samples."""
    runtime.seed_everything(0, per_rank=False)
    ref = models.digits_mlp()
    optimizer = torch.optim.SGD(ref.parameters(), lr=0.5)
    for x, y in DataLoader(Subset(train_set, range(used)), batch_size=32 * WORLD):
        optimizer.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        optimizer.step()
    return ref


def handed(share: Subset, wrap: Callable, after_backward: Callable = nothing) -> list:
    """The chapter's `handed`: each all-reduce's bytes in the second step."""
    runtime.seed_everything(0, per_rank=False)
    net = wrap(models.digits_mlp())
    hooked = isinstance(net, DistributedDataParallel)
    sizes = watch_torch_buckets(net) if hooked else None
    x, y = share[:32]
    for _ in range(2):
        net.zero_grad()
        with Ledger() as ledger:
            F.cross_entropy(net(x), y).backward()
            after_backward(net)
    calls = [r.bytes for r in ledger.records if r.op == "all_reduce"]
    return sizes[-1] if hooked else calls


def wire(grad: torch.Tensor, kinds: tuple[str, ...]) -> dict[str, list[int]]:
    """The chapter's wire cell: every rank's bytes of `kinds` in ring and naive."""
    found = {}
    for name, algorithm in {"ring": ring_all_reduce, "naive": naive_all_reduce}.items():
        with Ledger() as ledger:
            algorithm(grad.clone())
        sent = sum(r.bytes for r in ledger.records if r.kind in kinds)
        found[name] = [None] * WORLD
        dist.all_gather_object(found[name], sent)
    return found


def _on_each_rank(train_set: TensorDataset) -> dict[str, object]:
    """Every check of the chapter, as written and with its faults, on this rank."""
    rank = dist.get_rank()
    share = partition(train_set)
    reference = one_process(train_set, WORLD * len(share))
    runs = {  # name -> (wrap, after_backward)
        "by hand": (lambda m: m, average_gradients),
        "by hand, summed": (lambda m: m, summed_gradients),
        "no averaging": (lambda m: m, nothing),
        "TinyDDP": (TinyDDP, TinyDDP.wait),
        "TinyDDP, summed": (lambda m: TinyDDP(m, divide=False), TinyDDP.wait),
        "our DDP": (ours, nothing),
        "our DDP, summed": (summing(ours), nothing),
        "torch DDP": (theirs, nothing),
        "torch DDP, summed": (summing(theirs), nothing),
    }
    trained = {name: train_share(share, *fns) for name, fns in runs.items()}
    found: dict[str, object] = {}
    for name, (model, _) in trained.items():
        worst = checks.max_over_ranks(checks.max_difference(model, reference))
        found[f"{name} vs one process"] = checks.verdict(worst, TOL)
    for name in ("by hand", "no averaging"):
        found[f"{name}: identical"] = replicas.same_on_all_ranks(trained[name][0])
    for name in ("TinyDDP", "TinyDDP, summed"):
        gap = checks.max_difference(trained[name][0], trained["by hand"][0])
        found[f"{name} and by hand"] = checks.max_over_ranks(gap) == 0
    for name in ("our DDP", "our DDP, summed"):
        pairs = zip(trained[name][1], trained["torch DDP"][1], strict=True)
        found[f"{name} vs torch losses"] = checks.verdict(
            max(abs(a - b) for a, b in pairs), TOL
        )
    size = 4 * models.count_parameters(models.digits_mlp())  # S
    ways = {
        "by hand": (lambda m: m, average_gradients),
        "by hand, one left out": (lambda m: m, all_but_the_last),
        "our DDP": (ours,),
        "our DDP, one frozen": (frozen_bias(ours),),
        "torch DDP": (theirs,),
        "torch DDP, one frozen": (frozen_bias(theirs),),
    }
    for name, fns in ways.items():
        found[f"{name}: in all S"] = sum(handed(share, *fns)) == size
    grad = torch.cat([p.grad.reshape(-1) for p in trained["our DDP"][0].parameters()])
    for label, kinds in (("", ("send",)), (", receives too", ("send", "recv"))):
        ring, naive = wire(grad, kinds).values()
        found[f"ring{label}"] = sum(ring) == 2 * (WORLD - 1) * size
        found[f"naive{label}"] = (
            naive[0] == (WORLD - 1) * size,
            set(naive[1:]) == {size},
        )
    return found if rank == 0 else {}


@pytest.fixture(scope="module")
def train_set() -> TensorDataset:
    """The chapter's 1,348 training digits, loaded once here (not on every rank)."""
    return datasets.digits(train=True)


@pytest.fixture(scope="module")
def found(train_set: TensorDataset) -> dict[str, object]:
    """Rank 0's verdicts: the chapter prints rank 0's (all compare gathered data)."""
    return spawn(_on_each_rank, WORLD, train_set)[0]


def shares(train_set: TensorDataset, seeds: list[int]) -> bool:
    """The chapter's sampler check: the shares of epoch 2 cover every image."""
    everyone = []
    for rank, seed in enumerate(seeds):
        sampler = DistributedSampler(train_set, WORLD, rank, shuffle=True, seed=seed)
        sampler.set_epoch(2)
        everyone.append(list(sampler))
    return len(set().union(*everyone)) == len(train_set)


def test_as_written_every_check_passes(
    found: dict[str, object], train_set: TensorDataset
) -> None:
    for name in ("by hand", "TinyDDP", "our DDP", "torch DDP"):
        assert found[f"{name} vs one process"].endswith("PASS"), name
        assert name == "TinyDDP" or found[f"{name}: in all S"] is True, name
    assert found["by hand: identical"] is True
    assert found["TinyDDP and by hand"] is True
    assert found["our DDP vs torch losses"].endswith("PASS")
    assert found["ring"] is True and found["naive"] == (True, True)
    assert shares(train_set, [0] * WORLD)


@pytest.mark.controls(
    "03_data_parallel",
    r"after \d+ steps, parameters identical on all ranks: True",
    fault="the averaging left out: each rank steps on its own gradient",
)
def test_replicas_without_averaging_are_not_identical(found: dict) -> None:
    assert found["no averaging: identical"] is False


@pytest.mark.controls(
    "03_data_parallel",
    r"TinyDDP and by hand: parameters bit for bit identical on every rank: True",
    fault="TinyDDP without its division by the world size: gradients summed",
)
def test_a_tinyddp_that_sums_is_not_the_loop_by_hand(found: dict) -> None:
    assert found["TinyDDP, summed and by hand"] is False


@pytest.mark.controls(
    "03_data_parallel",
    r"max \|loss difference\| over \d+ steps <= 1e-06: PASS",
    fault="our DDP with a comm hook that sums the buckets instead of averaging",
)
def test_our_ddp_summing_is_not_torchs(found: dict) -> None:
    assert found["our DDP, summed vs torch losses"].endswith("FAIL")


@pytest.mark.controls(
    "03_data_parallel",
    r"by hand\s+max \|4 ranks - one process\|",
    fault="the loop by hand sums the gradients (all_reduce without / N)",
)
@pytest.mark.controls(
    "03_data_parallel",
    r"TinyDDP\s+max \|4 ranks - one process\|",
    fault="TinyDDP without its division by the world size: gradients summed",
)
@pytest.mark.controls(
    "03_data_parallel",
    r"our DDP\s+max \|4 ranks - one process\|",
    fault="our DDP with a comm hook that sums the buckets instead of averaging",
)
@pytest.mark.controls(
    "03_data_parallel",
    r"torch DDP\s+max \|4 ranks - one process\|",
    fault="torch's DDP with a comm hook that sums the buckets instead of averaging",
)
def test_summed_gradients_are_not_one_process(found: dict) -> None:
    for name in ("by hand", "TinyDDP", "our DDP", "torch DDP"):
        assert found[f"{name}, summed vs one process"].endswith("FAIL"), name


@pytest.mark.controls(
    "03_data_parallel",
    r"by hand\s+all-reduces: .*in all S: True",
    fault="the loop by hand averages every parameter but the last",
)
@pytest.mark.controls(
    "03_data_parallel",
    r"our DDP\s+all-reduces: .*in all S: True",
    fault="a parameter in no bucket (the first bias frozen)",
)
@pytest.mark.controls(
    "03_data_parallel",
    r"torch DDP\s+all-reduces: .*in all S: True",
    fault="a parameter in no bucket (the first bias frozen)",
)
def test_a_parameter_left_out_is_not_all_of_s(found: dict) -> None:
    assert found["by hand, one left out: in all S"] is False
    assert found["our DDP, one frozen: in all S"] is False
    assert found["torch DDP, one frozen: in all S"] is False


@pytest.mark.controls(
    "03_data_parallel",
    r"ring:\s+ranks sent .*: True",
    fault="the ledger's receives counted as sent bytes too",
)
@pytest.mark.controls(
    "03_data_parallel",
    r"naive: the root sent .*: True",
    fault="the ledger's receives counted as sent bytes too",
)
def test_bytes_counted_with_the_receives_are_not_the_formula(found: dict) -> None:
    assert found["ring, receives too"] is False
    assert found["naive, receives too"] == (False, False)


@pytest.mark.controls(
    "03_data_parallel",
    r"shares are disjoint and cover all [\d,]+ images: True",
    fault="each rank's sampler with a seed of its own (seed=rank)",
)
def test_samplers_seeded_apart_do_not_share_the_data(
    train_set: TensorDataset,
) -> None:
    assert not shares(train_set, list(range(WORLD)))

"""Negative controls of chapter 3b: each verdict it prints, shown failing on a fault.

The chapter runs PyTorch's DDP tutorial with our DDP swapped in, OneFlow's toy model
on two halves of a batch against one process, Paddle's quick start in PyTorch, and
a checkpoint resumed mid-epoch. Here the same programs and checks run on 2 ranks
with a fault planted, all in one spawn: the tutorial's `demo_basic` is imported from
book/scripts and run in the ranks with its `DDP` name bound to another class (what
the chapter's one swapped import line does), after the spawn's own group is gone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
from pathlib import Path

import ddp_faults
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from distcourse import checks, runtime
from distcourse.examples import checkpoint, datasets, models, train
from distcourse.launch import spawn
from distcourse.launch.script import free_port
from distcourse.parallel.ddp import DDP
from distcourse.rendezvous import keep_gloo_on_loopback

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "book" / "scripts" / "ddp_tutorial.py"
DDPS = {  # what the tutorial's `DDP` is bound to, by run
    "torch": DistributedDataParallel,
    "ours": DDP,
    "summing": ddp_faults.SummingDDP,
    "unsynced": ddp_faults.UnsyncedDDP,
}


def oneflow_quickstart(wrap: type) -> tuple[list[float], torch.Tensor]:
    """The chapter's OneFlow toy model: this rank's 10 of the 20 rows."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = models.toy_mlp()
    x, y = datasets.synthetic_regression(20)
    rows = slice(10 * rank, 10 * rank + 10)
    losses = train.sgd_steps(wrap(model), x[rows], y[rows], steps=20)
    return losses, checks.flat_parameters(model)


def paddle_quickstart(stranger: bool) -> bool:
    """The chapter's Paddle quick start; `stranger`: Adam built on the parameters
    of another model than the one trained. The chapter's check, on this rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    data, _ = datasets.cifar10_or_patterns(root=str(ROOT / "book" / "data"), n=512)
    sampler = DistributedSampler(data, world, rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(models.SmallCNN())
    params = models.SmallCNN().parameters() if stranger else model.parameters()
    losses = train.fit(model, loader, torch.optim.Adam(params, lr=1e-3), 4)
    return sum(losses[-4:]) < sum(losses[:4]) / 2


def resumed(path: str, forget: list[str]) -> bool:
    """The chapter's checkpoint runs: resumed (leaving out `forget`) equals the
    uninterrupted run, float for float, on this rank."""
    full = checkpoint.train(path)
    checkpoint.train(path, stop_after=6)
    return checkpoint.train(path, resume=True, forget=forget) == full[6:]


def tutorial_basic(name: str, rank: int, out: Path, port: int) -> list[str]:
    """The tutorial's demo_basic on this rank, with `DDP` bound to DDPS[name]; its
    printed lines. It makes (and destroys) a process group of its own."""
    spec = importlib.util.spec_from_file_location("ddp_tutorial", TUTORIAL)
    tutorial = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tutorial)
    tutorial.DDP = DDPS[name]
    os.environ.update(MASTER_PORT=str(port), TUTORIAL_OUT=str(out / name))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        tutorial.demo_basic(rank, 2)
    return printed.getvalue().splitlines()


def _on_each_rank(out: Path, ports: list[int]) -> dict[str, object]:
    """Every program of the chapter, as written and with its faults, on this rank."""
    rank = dist.get_rank()
    found = {
        "oneflow": oneflow_quickstart(DDP),
        "oneflow summing": oneflow_quickstart(ddp_faults.SummingDDP),
        "paddle": paddle_quickstart(stranger=False),
        "paddle stranger": paddle_quickstart(stranger=True),
        "resumed": resumed(str(out / "ckpt.pt"), []),
        "resumed without rng": resumed(str(out / "ckpt.pt"), ["rng"]),
    }
    runtime.shutdown()  # the tutorial makes its own group, as it does under mp.spawn
    keep_gloo_on_loopback()
    for name, port in zip(DDPS, ports, strict=True):
        found[f"tutorial {name}"] = tutorial_basic(name, rank, out, port)
    return found


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("chapter_3b")
    for name in DDPS:
        (out / name).mkdir()
    ports = [free_port() for _ in DDPS]
    return spawn(_on_each_rank, 2, out, ports), out


def one_process() -> tuple[list[float], torch.Tensor]:
    """The chapter's reference: one process on all 20 rows."""
    torch.manual_seed(0)
    single = models.toy_mlp()
    full = train.sgd_steps(single, *datasets.synthetic_regression(20), steps=20)
    return full, checks.flat_parameters(single)


def oneflow_verdicts(per_rank: list[tuple[list[float], torch.Tensor]]) -> list[str]:
    """The chapter's two checks: each rank's parameters, then the mean loss."""
    full, flat = one_process()
    halves = [(a + b) / 2 for a, b in zip(per_rank[0][0], per_rank[1][0], strict=True)]
    loss_diff = max(abs(a - b) for a, b in zip(halves, full, strict=True))
    found = [checks.verdict((p - flat).abs().max().item(), 1e-6) for _, p in per_rank]
    return [*found, checks.verdict(loss_diff, 1e-6)]


def tutorial_checks(ranks: list[dict], out: Path, name: str) -> list[tuple[bool, bool]]:
    """The chapter's two checks of the swap, per rank: every printed line as with
    torch's DDP, and the saved parameters identical bit for bit."""
    found = []
    for rank, printed in enumerate(ranks):
        a, b = (torch.load(out / d / f"basic-{rank}.pt") for d in ("torch", name))
        same = all(torch.equal(a[k], b[k]) for k in a)
        found.append((printed[f"tutorial {name}"] == printed["tutorial torch"], same))
    return found


def test_as_written_every_check_passes(ranks: tuple[list[dict], Path]) -> None:
    found, out = ranks
    assert tutorial_checks(found, out, "ours") == [(True, True)] * 2
    verdicts = oneflow_verdicts([r["oneflow"] for r in found])
    assert all(v.endswith("PASS") for v in verdicts), verdicts
    assert all(r["paddle"] for r in found)
    assert all(r["resumed"] for r in found)


@pytest.mark.controls(
    "03b_ddp_in_practice",
    r"every line as with torch's DDP: True",
    fault="the swapped-in DDP never copies rank 0's weights to rank 1 "
    "(init_sync=False)",
)
@pytest.mark.controls(
    "03b_ddp_in_practice",
    r"parameters identical to torch DDP's, bit for bit: True",
    fault="the swapped-in DDP sums the gradients instead of averaging them",
)
def test_a_ddp_unlike_torchs_fails_the_swap(ranks: tuple[list[dict], Path]) -> None:
    found, out = ranks
    lines_alike = [same for same, _ in tutorial_checks(found, out, "unsynced")]
    assert not all(lines_alike)
    assert not any(same for _, same in tutorial_checks(found, out, "summing"))


@pytest.mark.controls(
    "03b_ddp_in_practice",
    r"parameters vs 1 process: <= 1e-06: PASS",
    fault="DDP's gradients summed over the 2 ranks, not averaged",
)
@pytest.mark.controls(
    "03b_ddp_in_practice",
    r"mean of the 2 ranks' losses vs 1 process: <= 1e-06: PASS",
    fault="DDP's gradients summed over the 2 ranks, not averaged",
)
def test_halves_summed_are_not_the_whole(ranks: tuple[list[dict], Path]) -> None:
    verdicts = oneflow_verdicts([r["oneflow summing"] for r in ranks[0]])
    assert all(v.endswith("FAIL") for v in verdicts), verdicts


@pytest.mark.controls(
    "03b_ddp_in_practice",
    r"mean loss of its last 4 steps below half of its first 4: True",
    fault="Adam given another model's parameters: the trained model never moves",
)
def test_an_optimizer_on_the_wrong_model_learns_nothing(
    ranks: tuple[list[dict], Path],
) -> None:
    assert not any(r["paddle stranger"] for r in ranks[0])


@pytest.mark.controls(
    "03b_ddp_in_practice",
    r"resumed == uninterrupted, float for float: True",
    fault="the generators' states not restored: dropout and augmentation draw anew",
)
def test_a_resume_without_the_generators_differs(
    ranks: tuple[list[dict], Path],
) -> None:
    assert not any(r["resumed without rng"] for r in ranks[0])

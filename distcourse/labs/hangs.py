"""The labs that hang or crash: calls the ranks do not make alike.

Each program is what every rank runs, calling the function the reader fixes (`fix`);
each `*_one_process` computes what one process gets, for the comparison after a run.
With the broken function the ranks part: a collective one rank skips, the same
collectives in another order, point-to-point messages nobody receives, sizes that
differ. The recorder shows where; the group's timeout ends the wait.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distcourse.labs.compare import against_one, same_everywhere
from distcourse.labs.core import Fix, ReaderError, expect

LR = 0.1
STEPS = 2


def batch(rank: int, step: int, out: int = 1) -> tuple[Tensor, Tensor]:
    """Rank `rank`'s batch at `step`: 8 samples of 4 features, `out` targets."""
    g = torch.Generator().manual_seed(100 + 10 * step + rank)
    return torch.randn(8, 4, generator=g), torch.randn(8, out, generator=g)


def number(value: object, what: str) -> float:
    """A float from a number or a one-element tensor, else ReaderError."""
    if isinstance(value, Tensor) and value.numel() == 1:
        return float(value.item())
    return float(expect(value, (float, int), what))


def flat_grad(model: nn.Module) -> Tensor:
    """Every parameter's gradient, in one 1-D tensor (one all-reduce for all)."""
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def sgd_step(model: nn.Module, flat: Tensor) -> None:
    """p -= LR * its piece of the flat gradient."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p -= LR * flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()


def params(model: nn.Module) -> Tensor:
    """Every parameter, detached, in one 1-D tensor (for comparisons)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ---- a collective one rank skips: the loss averaged for logging on rank 0 only ----


def logging_program(log_loss: Fix, rank: int, world: int) -> dict:
    """Two SGD steps of data parallelism (gradients all-reduced by hand), logging
    each step's loss averaged over ranks: `log_loss(loss, rank, world) -> float`."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    logged = []
    for step in range(STEPS):
        x, y = batch(rank, step)
        loss = F.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()
        flat = flat_grad(model)
        dist.all_reduce(flat)
        sgd_step(model, flat / world)
        value = log_loss(loss.detach().clone(), rank, world)
        logged.append(number(value, "log_loss's return value"))
    return {
        "logged": torch.tensor(logged, dtype=torch.float64),
        "params": params(model),
    }


def log_loss_broken(loss: Tensor, rank: int, world: int) -> float:
    """Only rank 0 prints the loss, so only rank 0 averages it."""
    if rank == 0:
        dist.all_reduce(loss)
        return loss.item() / world
    return loss.item()


def logging_compare(outs: list[dict]) -> list[str]:
    """One process: the same steps on every rank's batch at once (their mean loss)."""
    world = len(outs)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    logged = []
    for step in range(STEPS):
        losses = [
            F.mse_loss(model(x), y) for x, y in (batch(r, step) for r in range(world))
        ]
        loss = torch.stack(losses).mean()
        model.zero_grad()
        loss.backward()
        sgd_step(model, flat_grad(model))
        logged.append(loss.item())
    want_log = torch.tensor(logged, dtype=torch.float64)
    return [
        *against_one(
            "logged loss", [o["logged"] for o in outs], same_everywhere(want_log, world)
        ),
        *against_one(
            "parameters",
            [o["params"] for o in outs],
            same_everywhere(params(model), world),
        ),
    ]


# ---- collectives in a different order: gradients synced as they became ready ----


def ready_program(sync: Fix, rank: int, world: int) -> dict:
    """One backward; `sync(grads, world)` averages the gradients in place. `grads`
    lists them in the order they became ready on this rank: on odd ranks, backward
    happened to finish the last layer first."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    x, y = batch(rank, 0, out=2)
    F.mse_loss(model(x), y).backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    if rank % 2:
        grads = dict(reversed(grads.items()))
    _all_ready(rank, world)
    sync(grads, world)
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _all_ready(rank: int, world: int) -> None:
    """Every rank has its gradients before any calls a collective: a slow rank would
    otherwise still be computing when two others' mismatched all_reduce aborts, and
    the report would say it never entered. Through the store, not a collective, so
    the recorder sees nothing of it."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"lab-ready-{rank}", "1")
    store.wait([f"lab-ready-{r}" for r in range(world)], timedelta(seconds=10))


def sync_grads_broken(grads: dict[str, Tensor], world: int) -> None:
    """Average each gradient over the ranks, in the order they became ready."""
    for grad in grads.values():
        dist.all_reduce(grad)
        grad /= world


def ready_compare(outs: list[dict]) -> list[str]:
    """One process: the gradients of the mean loss over every rank's batch."""
    world = len(outs)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    losses = [
        F.mse_loss(model(x), y) for x, y in (batch(r, 0, out=2) for r in range(world))
    ]
    torch.stack(losses).mean().backward()
    problems = []
    for name, p in model.named_parameters():
        got = [o[name] for o in outs]
        problems += against_one(f"{name}.grad", got, same_everywhere(p.grad, world))
    return problems


# ---- a pipeline with fewer micro-batches than stages: 1F1B's warm-up ----

MICRO = 2  # micro-batches, fewer than the 4 stages


def _stage(stage: int) -> nn.Linear:
    torch.manual_seed(10 + stage)
    return nn.Linear(4, 4)


def _micro(i: int) -> Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(200 + i))


def _recv(src: int) -> Tensor:
    t = torch.empty(2, 4)
    dist.recv(t, src)  # devicecheck: host (labs run on gloo CPU ranks)
    return t


def pipeline_program(warmup: Fix, rank: int, world: int) -> dict:
    """1F1B on `world` stages (a Linear each) over MICRO micro-batches: first
    `warmup(stage, stages, micro_batches)` forwards, then one forward and one
    backward at a time, then the backwards left. Sends are isend, receives wait."""
    layer, last = _stage(rank), rank == world - 1
    count = warmup(rank, world, MICRO)
    w = expect(count, int, "warmup's return value")
    if w < 0:
        raise ReaderError(f"warmup returned {w}: a count of forwards is not negative")
    inputs, outputs, sends = {}, {}, []

    def forward(i: int) -> None:
        x = _micro(i) if rank == 0 else _recv(rank - 1).requires_grad_()
        y = layer(x)
        inputs[i], outputs[i] = x, (y**2).sum() if last else y
        if not last:
            sends.append(dist.isend(y.detach(), rank + 1))

    def backward(i: int) -> None:
        outputs[i].backward(None if last else _recv(rank + 1))
        if rank > 0:
            sends.append(dist.isend(inputs[i].grad, rank - 1))

    steady = max(MICRO - w, 0)
    for i in range(w):
        forward(i)
    for j in range(steady):
        forward(w + j)
        backward(j)
    for j in range(steady, steady + w):
        backward(j)
    for s in sends:
        s.wait()
    return {"weight": layer.weight.grad, "bias": layer.bias.grad}


def warmup_broken(stage: int, stages: int, micro_batches: int) -> int:
    """1F1B's warm-up: a stage runs one forward per stage after it."""
    return stages - stage - 1


def pipeline_compare(outs: list[dict]) -> list[str]:
    """One process: the stages as one Sequential, the loss summed over micro-batches."""
    layers = [_stage(s) for s in range(len(outs))]
    loss = sum((nn.Sequential(*layers)(_micro(i)) ** 2).sum() for i in range(MICRO))
    loss.backward()
    problems = []
    for what in ("weight", "bias"):
        want = [getattr(layer, what).grad for layer in layers]
        problems += against_one(f"stage {what}.grad", [o[what] for o in outs], want)
    return problems


# ---- sizes that differ: predictions gathered from an uneven last batch ----

SAMPLES = 5  # split over 2 ranks: 3 and 2


def gather_program(gather: Fix, rank: int, world: int) -> dict:
    """Evaluation: rank r predicts samples r, r + world, ...; `gather(preds, world)`
    returns every rank's predictions, rank 0's first."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        preds = model(x[rank::world])
    got = gather(preds, world)
    return {"all": expect(got, Tensor, "gather's return value")}


def gather_broken(preds: Tensor, world: int) -> Tensor:
    """all_gather every rank's predictions (each rank makes as many as it has)."""
    pieces = [torch.empty_like(preds) for _ in range(world)]
    dist.all_gather(pieces, preds)
    return torch.cat(pieces)


def gather_compare(outs: list[dict]) -> list[str]:
    """One process: every rank's predictions, rank 0's first, on every rank."""
    world = len(outs)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = torch.cat([model(x[r::world]) for r in range(world)])
    return against_one(
        "gathered predictions", [o["all"] for o in outs], same_everywhere(want, world)
    )

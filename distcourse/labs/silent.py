"""The labs that do not hang: every rank finishes, and the numbers are wrong.

No timeout can find these. What finds them is a comparison: with one process (the
same model on the whole batch), and across ranks (a tensor that should be the same
everywhere is not). Each `*_compare` runs in the launcher after the ranks finished.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from distcourse.comm.autograd import reduce_from_group
from distcourse.labs.compare import against_one, replicated, same_everywhere
from distcourse.labs.core import Fix, ReaderError, expect
from distcourse.labs.hangs import LR, STEPS, batch, flat_grad, params, sgd_step
from distcourse.labs.report import first_sentence, ranks_text

SEED = 1234

# ---- a dropout seed that differs across tensor-parallel ranks ----


def _mlp() -> tuple[Tensor, Tensor, Tensor]:
    torch.manual_seed(3)
    return torch.randn(16, 8) * 0.3, torch.randn(8, 16) * 0.3, torch.randn(4, 8)


def dropout_program(dropout_seed: Fix, rank: int, world: int) -> dict:
    """A tensor-parallel MLP (column- then row-parallel), its output all-reduced
    (now the same on every rank), then dropout seeded by
    `dropout_seed(seed, tp_rank, tp_size)`."""
    w1, w2, x = _mlp()
    rows = slice(rank * 16 // world, (rank + 1) * 16 // world)
    w1 = w1[rows].clone().requires_grad_()
    w2 = w2[:, rows].clone().requires_grad_()
    y = reduce_from_group(torch.relu(x @ w1.T) @ w2.T, check=False)
    torch.manual_seed(expect(dropout_seed(SEED, rank, world), int, "the seed"))
    y = F.dropout(y, p=0.5, training=True)
    (y**2).sum().backward()
    return {"output": y.detach(), "w1.grad": w1.grad, "w2.grad": w2.grad}


def dropout_seed_broken(seed: int, tp_rank: int, tp_size: int) -> int:
    """Every rank its own random stream, as for data loading."""
    return seed + tp_rank


def dropout_compare(outs: list[dict]) -> list[str]:
    """One process: the whole MLP, dropout seeded with SEED; and across ranks."""
    world = len(outs)
    w1, w2, x = _mlp()
    w1.requires_grad_()
    w2.requires_grad_()
    torch.manual_seed(SEED)
    y = F.dropout(torch.relu(x @ w1.T) @ w2.T, p=0.5, training=True)
    (y**2).sum().backward()
    got = [o["output"] for o in outs]
    rows = [slice(r * 16 // world, (r + 1) * 16 // world) for r in range(world)]
    return [
        *replicated("output after dropout", got),
        *against_one("output after dropout", got, same_everywhere(y.detach(), world)),
        *against_one(
            "w1.grad", [o["w1.grad"] for o in outs], [w1.grad[r] for r in rows]
        ),
        *against_one(
            "w2.grad", [o["w2.grad"] for o in outs], [w2.grad[:, r] for r in rows]
        ),
    ]


# ---- LayerNorm under sequence parallelism: gradients left unsynchronised ----


def _norm_data() -> tuple[nn.LayerNorm, Tensor, Tensor]:
    torch.manual_seed(5)
    norm = nn.LayerNorm(4)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(4))
        norm.bias.copy_(0.1 * torch.randn(4))
    return norm, torch.randn(8, 4), torch.randn(8, 4)


def norm_program(sync_norm_grads: Fix, rank: int, world: int) -> dict:
    """Sequence parallelism: each rank normalises its own rows of the sequence with
    the same LayerNorm; `sync_norm_grads(norm, world)` readies its gradients for
    the SGD step that follows."""
    norm, x, target = _norm_data()
    rows = slice(rank * 8 // world, (rank + 1) * 8 // world)
    (norm(x[rows]) * target[rows]).sum().backward()
    sync_norm_grads(norm, world)
    out = {f"{n}.grad": p.grad.clone() for n, p in norm.named_parameters()}
    with torch.no_grad():
        for name, p in norm.named_parameters():
            p -= LR * p.grad
            out[name] = p.detach().clone()
    return out


def sync_norm_grads_broken(norm: nn.LayerNorm, world: int) -> None:
    """Nothing to do: the norm's weights are replicated, the same on every rank."""


def norm_compare(outs: list[dict]) -> list[str]:
    """One process: the norm over the whole sequence; and the weights across ranks."""
    world = len(outs)
    norm, x, target = _norm_data()
    (norm(x) * target).sum().backward()
    problems = replicated("weight", [o["weight"] for o in outs])
    for name, p in norm.named_parameters():
        problems += against_one(
            f"{name}.grad",
            [o[f"{name}.grad"] for o in outs],
            same_everywhere(p.grad, world),
        )
    return problems


# ---- a sampler that feeds every rank the same data ----

SAMPLES = 16


def samples() -> TensorDataset:
    """16 samples, each (its index, 4 features, a target)."""
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(SAMPLES, 4, generator=g), torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(torch.arange(SAMPLES), x, y)


def sampler_program(make_loader: Fix, rank: int, world: int) -> dict:
    """One epoch of data parallelism over `make_loader(dataset, rank, world)`'s
    batches of (index, x, y); gradients all-reduced by hand."""
    loader = make_loader(samples(), rank, world)
    try:
        batches = list(loader)
    except Exception as err:
        raise ReaderError(
            f"iterating your loader raised {type(err).__name__}: {err}"
        ) from None
    torch.manual_seed(0)
    model, seen = nn.Linear(4, 1), []
    for item in batches:
        index, x, y = expect(item, (list, tuple), "each batch")
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        flat = flat_grad(model)
        dist.all_reduce(flat)
        sgd_step(model, flat / world)
        seen.append(index.tolist())
    return {"seen": seen, "params": params(model)}


def make_loader_broken(dataset: TensorDataset, rank: int, world: int) -> DataLoader:
    """Batches of 4, in order."""
    return DataLoader(dataset, batch_size=4)


def sampler_compare(outs: list[dict]) -> list[str]:
    """Which rank saw which sample (each once, in one epoch), and one process
    trained on the same global batches."""
    world = len(outs)
    who: dict[int, list[int]] = {}
    for rank, out in enumerate(outs):
        for index in (i for step in out["seen"] for i in step):
            who.setdefault(index, []).append(rank)
    counts = Counter(len(r) for r in who.values())
    problems = []
    if len(who) != SAMPLES or set(counts) != {1}:
        twice = sorted(i for i, r in who.items() if len(r) > 1)
        line = f"in one epoch the ranks saw {len(who)} distinct samples of {SAMPLES}"
        if twice:
            by = ranks_text(who[twice[0]])
            line += f"; {len(twice)} more than once (sample {twice[0]} by {by})"
        problems.append(line + "; one process sees each sample once")
    data = samples()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    for step in range(min(len(o["seen"]) for o in outs)):
        losses = [
            F.mse_loss(
                model(data.tensors[1][o["seen"][step]]),
                data.tensors[2][o["seen"][step]],
            )
            for o in outs
        ]
        model.zero_grad()
        torch.stack(losses).mean().backward()
        sgd_step(model, flat_grad(model))
    return problems + against_one(
        "parameters", [o["params"] for o in outs], same_everywhere(params(model), world)
    )


# ---- torch DDP with a parameter the forward never uses ----


class TwoHeads(nn.Module):
    """A body and a head; `aux` is a second head, used only in another experiment."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head, self.aux = (
            nn.Linear(4, 4),
            nn.Linear(4, 1),
            nn.Linear(4, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.body(x)))


def unused_program(wrap: Fix, rank: int, world: int) -> dict:
    """STEPS of SGD on `wrap(model)` (torch's DDP, as the reader builds it). An
    error of torch's DDP ends the run early, and is returned with what came before:
    the first step's gradients."""
    torch.manual_seed(0)
    model = TwoHeads()
    wrapped = expect(wrap(model), nn.Module, "wrap's return value")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    first, none, error = None, [], ""
    for step in range(STEPS):
        x, y = batch(rank, step)
        opt.zero_grad()
        try:
            loss = F.mse_loss(wrapped(x), y)
        except RuntimeError as err:  # torch's DDP, at the forward after
            said = first_sentence(err).rstrip(".")  # name what its message counts
            error = (
                f"step {step + 1}: torch's DDP raised '{said}' (parameters without "
                f"a gradient in step {step}: {', '.join(none)})"
            )
            break
        loss.backward()
        none = [n for n, p in model.named_parameters() if p.grad is None]
        used = [p.grad for n, p in model.named_parameters() if n not in none]
        first = torch.cat([g.reshape(-1) for g in used]) if first is None else first
        opt.step()
    return {"first gradients": first, "params": params(model), "error": error}


def wrap_broken(model: nn.Module) -> nn.Module:
    """torch's DDP, as in its tutorial."""
    return DDP(model)


def unused_compare(outs: list[dict]) -> list[str]:
    """torch DDP's error if it raised; step 1's gradients across ranks and against
    one process; the parameters after STEPS."""
    world = len(outs)
    torch.manual_seed(0)
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    first = None
    for step in range(STEPS):
        opt.zero_grad()
        losses = [
            F.mse_loss(model(x), y) for x, y in (batch(r, step) for r in range(world))
        ]
        torch.stack(losses).mean().backward()
        used = [p.grad for n, p in model.named_parameters() if not n.startswith("aux")]
        first = torch.cat([g.reshape(-1) for g in used]) if first is None else first
        opt.step()
    errors: dict[str, list[int]] = {}
    for rank, out in enumerate(outs):
        if out["error"]:
            errors.setdefault(out["error"], []).append(rank)
    return [
        *(f"{ranks_text(r)}: {message}" for message, r in errors.items()),
        *replicated("gradients of step 1", [o["first gradients"] for o in outs]),
        *against_one(
            "gradients of step 1",
            [o["first gradients"] for o in outs],
            same_everywhere(first, world),
        ),
        *against_one(
            "parameters",
            [o["params"] for o in outs],
            same_everywhere(params(model), world),
        ),
    ]

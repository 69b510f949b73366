"""FSDP over the data-parallel axis, tensor parallelism inside: the 2-D composition.

torchtitan parallelizes a model in this order: tensor parallelism first (each
block's Linear layers split over `mesh["tp"]`), then FSDP over `mesh["dp"]`, which
shards whatever TP left on each rank. Here the same, twice:

- `parallelize_gpt(model, mesh)`: an `examples.gpt.TinyGPT` split by chapter 4's
  `parallel.tensor.parallelize_gpt` over tp (query, key, value and fc
  column-parallel, the two projections row-parallel, the embedding and head split
  by vocabulary), then each block and the root `fully_shard`ed over dp. Its
  logits are this rank's vocabulary slice: the loss is
  `tensor.vocab_parallel_cross_entropy` over tp.
- `parallelize_mlp(model, mesh)`: a plain MLP, its first Linear column-parallel and
  its second row-parallel (Megatron's pair), every Linear and the root sharded.

A rank holds 1/(dp x tp) of the split layers and 1/dp of the others; the TP ranks of
one dp group see the same rows, the dp groups different rows. In chapter 6's
notation a column-parallel weight is S(0) over tp and, inside that, S(0) over dp:
FSDP gathers dp's pieces to run, TP never gathers its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from distcourse.examples import gpt
from distcourse.mesh import Mesh
from distcourse.parallel import fsdp, tensor
from distcourse.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from distcourse.parallel.tensor.edges import gather

# AdamW's eps at 1e-6: its step g / (|g| + eps) turns the rounding noise of a tiny
# gradient (float32 sums in another order) into a move of up to lr x noise / eps;
# at torch's 1e-8 that is 2e-5 on this model, beyond the 1e-5 the check allows.
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict]] = {
    "SGD": (torch.optim.SGD, dict(lr=0.1)),
    "AdamW": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1, eps=1e-6)),
}
# A key's bias adds the same number to every score of a query, which softmax
# ignores: its true gradient is 0, both runs hold rounding noise there, and AdamW
# divides noise by noise. Left out of AdamW's comparison (as chapter 8's is).
NOISE_ONLY = "key.bias"
ROWS = 2  # sequences per dp group per step


def parallelize_gpt(model: nn.Module, mesh: Mesh) -> nn.Module:
    """A TinyGPT split over mesh's "tp" axis (a copy: `model` is left as it was),
    then each block and the root sharded over its "dp" axis."""
    _check(mesh, "parallelize_gpt")
    twin = tensor.parallelize_gpt(model, mesh.group("tp"))
    for block in twin.blocks:
        fsdp.fully_shard(block, mesh=mesh["dp"])
    fsdp.fully_shard(twin, mesh=mesh["dp"])
    return twin


def parallelize_mlp(model: nn.Sequential, mesh: Mesh) -> nn.Sequential:
    """Split `model`'s first two Linear layers over mesh's "tp" axis, then shard
    every Linear and the root over its "dp" axis. `model` is changed in place."""
    _check(mesh, "parallelize_mlp")
    linears = [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    if len(linears) < 2:
        raise ValueError("parallelize_mlp needs at least two Linear layers")
    tp = mesh.group("tp")
    first, second = linears[:2]
    model[first] = ColumnParallelLinear.from_linear(model[first], group=tp)
    model[second] = RowParallelLinear.from_linear(model[second], group=tp)
    for i in linears:
        fsdp.fully_shard(model[i], mesh=mesh["dp"])
    fsdp.fully_shard(model, mesh=mesh["dp"])
    return model


def full_state_dict(model: nn.Module, mesh: Mesh) -> dict[str, Tensor]:
    """Every parameter whole, on every rank: FSDP's pieces gathered over dp, then
    the TP slices over tp (column layers and vocabulary-split embeddings along dim
    0, row layers' weights along dim 1; a row layer's bias is added after the sum,
    whole already). A collective: every rank calls it."""
    state = fsdp.full_state_dict(model)
    tp = mesh.group("tp")
    for name, layer in model.named_modules():
        if isinstance(layer, ColumnParallelLinear | VocabParallelEmbedding):
            dims = {"weight": 0, "bias": 0}
        elif isinstance(layer, RowParallelLinear):
            dims = {"weight": 1}
        else:
            continue
        for param, dim in dims.items():
            key = f"{name}.{param}" if name else param
            if key in state:
                state[key] = gather(state[key].contiguous(), dim, tp)
    return state


def train_gpt(
    mesh: Mesh,
    kind: str,
    steps: int,
    before_step: Callable[[nn.Module], None] | None = None,
    rows: int | None = None,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """A seeded TinyGPT under `parallelize_gpt` on `device`, trained `steps` steps
    of `kind` ("SGD" or "AdamW") on its dp group's rows of `one_process_gpt`'s
    batches (or dp group `rows`'s); `before_step(model)` runs between backward and
    the step."""
    model = parallelize_gpt(_seeded_gpt().to(device), mesh)
    cls, options = OPTIMIZERS[kind]
    opt = cls(model.parameters(), **options)
    dp, tp = mesh.size("dp"), mesh.group("tp")
    mine = slice_of(mesh.coordinate["dp"] if rows is None else rows)
    for x, y in gpt.token_batches(steps, dp * ROWS):
        x, y = x[mine].to(device), y[mine].to(device)
        opt.zero_grad()
        tensor.vocab_parallel_cross_entropy(model(x), y, tp).backward()
        if before_step is not None:
            before_step(model)
        opt.step()
    return model


def one_process_gpt(kind: str, steps: int, dp: int = 2) -> dict[str, Tensor]:
    """The state dict of the seeded TinyGPT after `steps` steps on all dp groups'
    rows at once."""
    model = _seeded_gpt()
    cls, options = OPTIMIZERS[kind]
    opt = cls(model.parameters(), **options)
    for x, y in gpt.token_batches(steps, dp * ROWS):
        opt.zero_grad()
        gpt.lm_loss(model(x), y).backward()
        opt.step()
    return model.state_dict()


def difference(
    state: dict[str, Tensor], reference: dict[str, Tensor], kind: str
) -> float:
    """Largest |state - reference| over the parameters, compared on the host
    (under AdamW, those ending in NOISE_ONLY left out)."""
    return max(
        (state[k].cpu() - reference[k].cpu()).abs().max().item()
        for k in reference
        if not (kind == "AdamW" and k.endswith(NOISE_ONLY))
    )


def start_gpt() -> dict[str, Tensor]:
    """The seeded TinyGPT's parameters before any step."""
    return _seeded_gpt().state_dict()


def slice_of(group: int) -> slice:
    """The rows of a step's batch that dp group `group` trains on."""
    return slice(group * ROWS, (group + 1) * ROWS)


def _seeded_gpt() -> nn.Module:
    torch.manual_seed(0)
    return gpt.TinyGPT(gpt.GPTConfig())


def _check(mesh: Mesh, name: str) -> None:
    if set(mesh.names) != {"dp", "tp"}:
        raise ValueError(f"{name} needs a ('dp', 'tp') mesh, got {mesh.names}")

"""FSDP over the data-parallel axis, tensor parallelism inside: the 2-D composition.

torchtitan parallelizes a model in this order: tensor parallelism first (each
block's Linear layers split over `mesh["tp"]`), then FSDP over `mesh["dp"]`, which
shards whatever TP left on each rank. Here the same, on a plain MLP
(Linear -> act -> Linear -> act -> ... ): the first Linear becomes column-parallel,
the second row-parallel (Megatron's pair: no message between them), the rest stay
whole; then each Linear and the root are `fully_shard`ed over the dp axis. A rank
holds 1/(dp x tp) of the split layers and 1/dp of the others; the TP ranks of one
dp group see the same rows, the dp groups different rows.

In chapter 6's notation a column-parallel weight is S(0) over tp and, inside that,
S(0) over dp: FSDP gathers dp's pieces to run, TP never gathers its own.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse.mesh import Mesh
from distcourse.parallel import fsdp
from distcourse.parallel.tensor import ColumnParallelLinear, RowParallelLinear


def parallelize_mlp(model: nn.Sequential, mesh: Mesh) -> nn.Sequential:
    """Split `model`'s first two Linear layers over mesh's "tp" axis, then shard
    every Linear and the root over its "dp" axis. `model` is changed in place."""
    if set(mesh.names) != {"dp", "tp"}:
        raise ValueError(f"parallelize_mlp needs a ('dp', 'tp') mesh, got {mesh.names}")
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


def full_state_dict(model: nn.Sequential, mesh: Mesh) -> dict[str, Tensor]:
    """Every parameter whole, on every rank: FSDP's pieces gathered over dp, then
    the TP slices over tp (column layers along dim 0, row layers' weights along
    dim 1). A collective: every rank calls it."""
    state = fsdp.full_state_dict(model)
    tp, size = mesh.group("tp"), mesh.size("tp")
    for index, layer in enumerate(model):
        if isinstance(layer, ColumnParallelLinear):
            dims = {"weight": 0, "bias": 0}
        elif isinstance(layer, RowParallelLinear):
            dims = {"weight": 1}  # the bias is added after the sum: whole already
        else:
            continue
        for name, dim in dims.items():
            key = f"{index}.{name}"
            if key not in state:
                continue
            parts = [torch.empty_like(state[key]) for _ in range(size)]
            dist.all_gather(parts, state[key].contiguous(), group=tp)
            state[key] = torch.cat(parts, dim=dim)
    return state

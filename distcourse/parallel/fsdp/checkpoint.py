"""Sharded state dicts that `torch.distributed.checkpoint` (DCP) saves and reshards.

`full_state_dict` gathers every parameter whole on every rank: simple, but each rank
then holds the whole model. A sharded checkpoint keeps each rank's pieces: every
piece becomes a DTensor, Shard(0) over its unit's group, with the full shape. This is
FSDP2's own layout (torch.chunk's rows), so the dicts here have the keys and
placements of torch's `get_state_dict(model, optimizer)`: a checkpoint that
`dcp.save` wrote from ours loads into torch's `fully_shard` and the other way round,
and DCP reads, for each rank, the rows it holds now, whatever the world size was at
saving (save on 4 ranks, load on 2 or 1).

    state = {"model": model_state(model), "optim": optimizer_state(model, opt)}
    dcp.save(state, checkpoint_id=path)
    ...                                     # a fresh model, sharded, any world
    state = {"model": model_state(model), "optim": optimizer_state(model, opt)}
    dcp.load(state, checkpoint_id=path)     # DCP fills the templates in place
    load_model_state(model, state["model"])
    load_optimizer_state(model, opt, state["optim"])
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from distcourse.parallel.fsdp.api import units
from distcourse.parallel.fsdp.layout import Piece


def model_state(model: nn.Module) -> dict[str, Tensor]:
    """`model.state_dict()` with each piece a DTensor Shard(0) of its full shape."""
    state = model.state_dict()
    for name, (piece, mesh) in _pieces(model).items():
        state[name] = _dtensor(state[name], piece, mesh)
    return state


def load_model_state(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Copy `state` (as `model_state` makes it, e.g. filled by `dcp.load`) into
    `model`'s pieces and other tensors."""
    local = {k: v.to_local() if isinstance(v, DTensor) else v for k, v in state.items()}
    model.load_state_dict(local)


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """`optimizer.state_dict()` keyed by parameter names, torch's `get_state_dict`
    form: {"state": {name: {key: tensor}}, "param_groups": [..., "params": names]};
    each piece-shaped tensor a DTensor. An optimizer that has not stepped gets its
    state first (one step at learning rate 0 on zero gradients), so that a template
    exists for `dcp.load` to fill."""
    _initialise(optimizer)
    names = {p: n for n, p in model.named_parameters()}
    shards = _pieces(model)
    state: dict[str, dict[str, Any]] = {}
    for p, values in optimizer.state.items():
        name = names[p]
        state[name] = {
            k: _dtensor(v, *shards[name])
            if name in shards and torch.is_tensor(v) and v.shape == p.shape and v.dim()
            else v
            for k, v in values.items()
        }
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}}
        | {"params": [names[p] for p in g["params"]]}
        for g in optimizer.param_groups
    ]
    return {"state": state, "param_groups": groups}


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict
) -> None:
    """Copy `state` (as `optimizer_state` makes it) into `optimizer`."""
    order = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    index = {name: i for i, name in enumerate(_flat_names(state["param_groups"]))}
    if sorted(index) != sorted(order):
        raise ValueError(
            "load_optimizer_state: parameter names differ from the model's"
        )
    plain = {
        index[name]: {
            k: v.to_local() if isinstance(v, DTensor) else v for k, v in values.items()
        }
        for name, values in state["state"].items()
    }
    groups = [
        {**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]
    ]
    optimizer.load_state_dict({"state": plain, "param_groups": groups})


def _flat_names(groups: list[dict]) -> list[str]:
    return [name for g in groups for name in g["params"]]


def _pieces(model: nn.Module) -> dict[str, tuple[Piece, DeviceMesh]]:
    """Each sharded parameter's name, Piece and 1-D mesh (its unit's group)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    if any(unit.replicate is not None for unit in units(model)):
        raise ValueError(
            "fsdp checkpoints: HSDP (a 2-D mesh) is not supported here; save "
            "full_state_dict(model) instead"
        )
    for unit in units(model):
        group = unit.group if unit.group is not None else dist.group.WORLD
        mesh = DeviceMesh.from_group(group, unit.device.type)
        for piece, shard in zip(unit.pieces, unit.sharded, strict=True):
            out[names[id(shard)]] = (piece, mesh)
    return out


def _dtensor(local: Tensor, piece: Piece, mesh: DeviceMesh) -> DTensor:
    """`local`, this rank's rows, as the Shard(0) DTensor of `piece`'s full shape."""
    stride = torch.empty(piece.shape, device="meta").stride()
    return DTensor.from_local(
        local.detach(),
        mesh,
        [Shard(0)],
        run_check=False,
        shape=piece.shape,
        stride=stride,
    )


def _initialise(optimizer: torch.optim.Optimizer) -> None:
    """Give an optimizer that never stepped its state: zero gradients, lr 0."""
    if optimizer.state:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for p in params:
        p.grad = torch.zeros_like(p)
    rates = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, rates, strict=True):
        g["lr"] = lr
    for p in params:
        p.grad = None

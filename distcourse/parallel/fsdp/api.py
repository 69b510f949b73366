"""`fully_shard` and full state dicts: FSDP2's calls, from scratch.

`fully_shard(module, *, mesh=None, reshard_after_forward=True)` makes `module` a unit
(`unit.Unit`): its parameters, except those of units inside it, become this rank's
dim-0 pieces, gathered around its forward and backward. As with torch's FSDP2, apply
it to each block, then to the root, and build the optimizer afterwards, on
`model.parameters()`. `full_state_dict(model)` is `get_model_state_dict(model,
options=StateDictOptions(full_state_dict=True))`: every parameter whole, on every
rank; `load_full_state_dict` cuts one back into pieces.
`set_modules_to_forward_prefetch(module, modules)` (also a method of each sharded
module, as FSDP2's `FSDPModule` has) makes `module`'s forward launch the gathers of
`modules` early; `hidden_fraction(model)` measures how much of them compute hid
(`gather_seconds(model)`: the seconds).

Everything is checked before the first collective, alike on every rank: a model
of other names, shapes or dtypes on some rank (agreed in `fully_shard`), a module
sharded twice, a mesh that is not 1-D or not within the world, parameters of mixed
dtypes in one unit, a state dict of other shapes, and an optimizer built on the
parameters `fully_shard` replaced (refused when it first steps).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.optim.optimizer import register_optimizer_step_pre_hook

from distcourse import runtime
from distcourse.comm.agree import agree_tensors
from distcourse.mesh import Mesh
from distcourse.parallel.fsdp.unit import Unit

UNITS: weakref.WeakKeyDictionary[nn.Module, Unit] = weakref.WeakKeyDictionary()
# the full parameters fully_shard replaced, by id (a WeakSet would compare tensors)
REPLACED: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()


def fully_shard(
    module: nn.Module,
    *,
    mesh: Mesh | DeviceMesh | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Shard `module`'s own parameters over `mesh` (the world if None); return it.

    First every rank of the mesh agrees (`agree_tensors`, one all-gather of a small
    descriptor): the same names, shapes and dtypes of the parameters to shard, the
    same module type and `reshard_after_forward`. A model of another shape on one
    rank is then a ValueError naming that rank on every rank, not the first
    forward's all-gather aborting (gloo) or hanging (NCCL). A rank that later skips
    a forward is not caught this cheaply (its gathers carry no step number): the
    group's timeout ends the wait, and `runtime.init(debug=True)` names the rank
    (torch's DETAIL checks compare every collective's fingerprint).
    """
    group = group_of(mesh)
    owners, tied = _own_parameters(module)
    kind = type(module).__name__  # names below as the module's, e.g. Linear.weight
    names = {
        id(p): f"{kind}.{n}" for n, p in module.named_parameters(remove_duplicate=False)
    }
    full = [getattr(m, n) for m, n in owners]
    agree_tensors(
        "fully_shard",
        [(names.get(id(p), n), p) for (_, n), p in zip(owners, full, strict=True)],
        group,
        config=dict(module=kind, reshard_after_forward=reshard_after_forward),
        validate=functools.partial(_check_unit, module, owners, tied),
    )
    unit = Unit(owners, group, reshard_after_forward) if owners else None
    UNITS[module] = unit  # type: ignore[assignment]  (None: nothing of its own)
    REPLACED.update({id(p): p for p in full})
    if unit is not None:
        module.register_forward_pre_hook(unit.before_forward)
        module.register_forward_hook(unit.after_forward)
    for method in (set_modules_to_forward_prefetch, set_modules_to_backward_prefetch):
        setattr(module, method.__name__, functools.partial(method, module))
    return module


def _check_unit(
    module: nn.Module, owners: list[tuple[nn.Module, str]], tied: list[str]
) -> None:
    """ValueError if `module` cannot become a unit (checked on this rank alone)."""
    if module in UNITS:
        raise ValueError(
            f"fully_shard was already applied to this {type(module).__name__}: "
            "shard each module once"
        )
    if tied:
        raise ValueError(f"fully_shard: tied parameter {tied[0]} is not supported")
    kinds = {(getattr(m, n).dtype, getattr(m, n).device) for m, n in owners}
    if len(kinds) > 1:
        raise ValueError(
            "fully_shard: one unit's parameters must share a dtype and device (one "
            f"collective moves them), got {sorted(map(str, kinds))}"
        )
    for m, name in owners:
        if getattr(m, name).dim() == 0:
            raise ValueError(f"fully_shard: {name} is a scalar, nothing to cut")


def world_mesh() -> DeviceMesh:
    """The world as a 1-D DeviceMesh on this rank's device type.

    What torch's `fully_shard` needs beside ours: given no mesh, torch takes the
    accelerator's device type whenever one is visible, so CPU (gloo) ranks on a GPU
    box would see their parameters moved to the GPU. Ours shards parameters where
    they are, and takes this mesh too.
    """
    return DeviceMesh.from_group(dist.group.WORLD, runtime.device().type)


def set_modules_to_forward_prefetch(
    module: nn.Module, modules: Iterable[nn.Module]
) -> None:
    """When `module`'s forward starts, launch the all-gathers of `modules` (units
    that run next): FSDP2's `FSDPModule.set_modules_to_forward_prefetch`."""
    targets = list(modules)
    unit = _prefetching(module, targets, "forward")  # checked before any is looked up
    unit.forward_prefetch = _targets(targets)


def set_modules_to_backward_prefetch(
    module: nn.Module, modules: Iterable[nn.Module]
) -> None:
    """When `module`'s backward starts, launch the all-gathers of `modules` (units
    whose backward comes next, e.g. the block before it)."""
    targets = list(modules)
    unit = _prefetching(module, targets, "backward")  # checked before any is looked up
    unit.backward_prefetch = _targets(targets)


def _prefetching(module: nn.Module, modules: Iterable[nn.Module], when: str) -> Unit:
    """The unit of `module`, after checking it and `modules` (no collective)."""
    for m in [module, *modules]:
        if not isinstance(m, nn.Module) or m not in UNITS:
            raise ValueError(
                f"set_modules_to_{when}_prefetch: {type(m).__name__} is not a "
                "fully_shard unit; apply fully_shard to it first"
            )
    unit = UNITS[module]
    if unit is None:
        raise ValueError(
            f"set_modules_to_{when}_prefetch: this {type(module).__name__} has no "
            "parameters of its own, so no hook of its own to prefetch from"
        )
    return unit


def _targets(modules: Iterable[nn.Module]) -> list[Unit]:
    """The units to prefetch (a unit with no parameters of its own gathers nothing)."""
    return [UNITS[m] for m in modules if UNITS[m] is not None]


def gather_seconds(model: nn.Module) -> tuple[float, float]:
    """(hidden, in flight): seconds of the all-gathers of `model`'s units in the
    last step (a unit's timeline restarts with its forward). In flight: launch to
    completion. Hidden: those that completed before their unit's `unshard` began
    to wait, counted whole; one that completed later counts nothing (it may have
    sat queued). A gather made when needed, without prefetch, completes after the
    wait began."""
    hidden = busy = 0.0
    for unit in units(model):
        spans = {e.name: e for e in unit.timeline}
        for k in range(unit.gathers):
            gather, use = spans[f"all_gather {k}"], spans[f"unshard {k}"]
            busy += gather.seconds
            hidden += gather.seconds if gather.end <= use.start else 0.0
    return hidden, busy


def hidden_fraction(model: nn.Module, clear: bool = True) -> float:
    """Share of the all-gathers' seconds in flight that compute provably hid: 0 to 1
    (`gather_seconds`, the last step); 0.0 without prefetch or without gathers.
    `clear` forgets the timed gathers (a second call then gives 0.0)."""
    hidden, busy = gather_seconds(model)
    if clear:
        for unit in units(model):
            unit.spans.clear()
            unit.gathers = 0
    return hidden / busy if busy > 0 else 0.0


def group_of(mesh: Mesh | DeviceMesh | None) -> Any:
    """The process group of a 1-D mesh within the world (None: the world)."""
    if mesh is None:
        return None
    device_mesh = mesh.device_mesh if isinstance(mesh, Mesh) else mesh
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(
            f"fully_shard: mesh must be a Mesh, a DeviceMesh or None, got {mesh!r}"
        )
    ranks = device_mesh.mesh.flatten().tolist()
    world = dist.get_world_size()
    if device_mesh.ndim != 1:
        raise ValueError(
            f"fully_shard: the mesh must be 1-D (got {device_mesh.ndim}-D); pass "
            "the data-parallel axis, e.g. mesh['dp']"
        )
    if any(not 0 <= r < world for r in ranks) or dist.get_rank() not in ranks:
        raise ValueError(
            f"fully_shard: the mesh's ranks {ranks} must be ranks of the world "
            f"(0..{world - 1}) and include this rank ({dist.get_rank()})"
        )
    return device_mesh.get_group(0)


def _own_parameters(
    module: nn.Module,
) -> tuple[list[tuple[nn.Module, str]], list[str]]:
    """(module, name) of each parameter not inside an inner unit, each once; and
    the names under which a parameter came again (tied)."""
    found: list[tuple[nn.Module, str]] = []
    tied: list[str] = []
    seen: set[int] = set()

    def walk(m: nn.Module) -> None:
        for name, p in m._parameters.items():
            if p is None:
                continue
            if id(p) in seen:
                tied.append(name)
                continue
            seen.add(id(p))
            found.append((m, name))
        for child in m.children():
            if child not in UNITS:
                walk(child)

    walk(module)
    return found, tied


def units(model: nn.Module) -> list[Unit]:
    """The units inside `model`, in module order (the same on every rank)."""
    return [UNITS[m] for m in model.modules() if m in UNITS and UNITS[m] is not None]


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """`model.state_dict()` with every sharded parameter whole, on every rank.

    One all-gather per unit (a collective: every rank calls it).
    """
    names = {id(p): name for name, p in model.named_parameters()}
    state = model.state_dict()
    for unit in units(model):
        segments = unit.gather_segments()
        for piece, shard in zip(unit.pieces, unit.sharded, strict=True):
            rows = segments[:, piece.offset : piece.offset + piece.padded]
            whole = rows.reshape(-1, *piece.shape[1:])[: piece.shape[0]]
            state[names[id(shard)]] = whole.clone()
    return state


def load_full_state_dict(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Each rank keeps its rows of `state`'s full tensors; no collective.

    Shapes and names are checked first: a mismatch raises on every rank alike.
    """
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for unit in units(model):
        names = {id(p): n for n, p in model.named_parameters()}
        for piece, shard in zip(unit.pieces, unit.sharded, strict=True):
            shapes[names[id(shard)]] = tuple(piece.shape)
    given = {name: tuple(t.shape) for name, t in state.items()}
    if given != shapes:
        wrong = sorted(
            n for n in shapes.keys() | given.keys() if shapes.get(n) != given.get(n)
        )
        raise ValueError(
            "load_full_state_dict: names or shapes differ from the model's: "
            + ", ".join(f"{n} {given.get(n)} != {shapes.get(n)}" for n in wrong)
        )
    cut = dict(state)
    for unit in units(model):
        names = {id(p): n for n, p in model.named_parameters()}
        for piece, shard in zip(unit.pieces, unit.sharded, strict=True):
            cut[names[id(shard)]] = piece.cut(state[names[id(shard)]])
    model.load_state_dict(cut)


def step_bytes(sharded: list[Unit], world: int) -> int:
    """Wire bytes per rank of one training step (ring convention): each unit's
    all-gather before forward, again before backward if it resharded, and its
    reduce-scatter, each (N - 1) x its padded segment."""
    total = 0
    for unit in sharded:
        calls = 3 if unit.reshard_after_forward else 2
        total += calls * (world - 1) * unit.width * unit.buffer.element_size()
    return total


def _refuse_replaced(optimizer: torch.optim.Optimizer, *_: Any) -> None:
    """Before any optimizer steps: none of its parameters may be a replaced one."""
    for group in optimizer.param_groups:
        if any(REPLACED.get(id(p)) is p for p in group["params"]):
            raise ValueError(
                "this optimizer holds parameters that fully_shard replaced by their "
                "pieces: build the optimizer after fully_shard, on model.parameters()"
            )


register_optimizer_step_pre_hook(_refuse_replaced)

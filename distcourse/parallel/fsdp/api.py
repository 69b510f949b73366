"""`fully_shard` and full state dicts: FSDP2's calls, from scratch.

`fully_shard(module, *, mesh=None, reshard_after_forward=None, mp_policy=None)` makes
`module` a unit (`unit.Unit`): its parameters, except those of units inside it,
become this rank's dim-0 pieces, gathered around its forward and backward. As with
torch's FSDP2, apply it to each block, then to the root, and build the optimizer
afterwards, on `model.parameters()`. The arguments mean what torch 2.14's mean
(`policy.py`): None reshards every unit but the root; a 2-D mesh is HSDP.
`set_requires_gradient_sync(module, False)` (also a method of each sharded module)
lets micro-batches add up full gradients locally, unsent, until one that syncs.
`full_state_dict(model)` is `get_model_state_dict(model,
options=StateDictOptions(full_state_dict=True))`: every parameter whole, on every
rank; `load_full_state_dict` cuts one back into pieces.
`set_modules_to_forward_prefetch(module, modules)` (also a method of each sharded
module, as FSDP2's `FSDPModule` has) makes `module`'s forward launch the gathers of
`modules` early; `hidden_fraction(model)` measures how much of them compute hid
(`gather_seconds(model)`: the seconds).

Everything is checked before the first collective, alike on every rank: a model
of other names, shapes or dtypes on some rank (agreed in `fully_shard`), a module
sharded twice, a mesh that is not 1-D or 2-D or not within the world, a policy
that is not one or names no floating dtype, parameters of mixed dtypes in one
unit, a state dict of other shapes, and an optimizer built on the parameters
`fully_shard` replaced (refused when it first steps).
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
from distcourse.parallel.fsdp.policy import (
    MixedPrecisionPolicy,
    groups_of,
    mixed_precision,
    reshard_setting,
    smaller_group,
)
from distcourse.parallel.fsdp.unit import Unit

UNITS: weakref.WeakKeyDictionary[nn.Module, Unit] = weakref.WeakKeyDictionary()
# the full parameters fully_shard replaced, by id (a WeakSet would compare tensors)
REPLACED: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()


def fully_shard(
    module: nn.Module,
    *,
    mesh: Mesh | DeviceMesh | None = None,
    reshard_after_forward: bool | int | None = None,
    mp_policy: MixedPrecisionPolicy | Any = None,
) -> nn.Module:
    """Shard `module`'s own parameters over `mesh` (the world if None); return it.

    `mesh` 2-D is HSDP: shard over dim 1, replicate over dim 0 (the gradients'
    pieces all-reduced there). `reshard_after_forward` and `mp_policy` as torch's
    (`policy.py`); checked, like the mesh, before the first collective.

    First every rank of the mesh agrees (`agree_tensors`, one all-gather of a small
    descriptor): the same names, shapes and dtypes of the parameters to shard, the
    same module type and `reshard_after_forward`. A model of another shape on one
    rank is then a ValueError naming that rank on every rank, not the first
    forward's all-gather aborting (gloo) or hanging (NCCL). A rank that later skips
    a forward is not caught this cheaply (its gathers carry no step number): the
    group's timeout ends the wait, and `runtime.init(debug=True)` names the rank
    (torch's DETAIL checks compare every collective's fingerprint).
    """
    group, replicate = groups_of(mesh)
    size = dist.get_world_size(group)
    whole = replicate is None and size == dist.get_world_size()
    setting = reshard_setting(reshard_after_forward, size, whole)
    policy = mixed_precision(mp_policy)
    owners, tied = _own_parameters(module)
    kind = type(module).__name__  # names below as the module's, e.g. Linear.weight
    names = {
        id(p): f"{kind}.{n}" for n, p in module.named_parameters(remove_duplicate=False)
    }
    full = [getattr(m, n) for m, n in owners]
    described = [
        (names.get(id(p), n), p) for (_, n), p in zip(owners, full, strict=True)
    ]
    config = dict(
        module=kind, reshard_after_forward=reshard_after_forward, mp=repr(policy)
    )
    for among in [group] if replicate is None else [group, replicate]:
        agree_tensors(
            "fully_shard",
            described,
            among,
            config=config,
            validate=functools.partial(_check_unit, module, owners, tied),
        )
    smaller = not isinstance(setting, bool) and isinstance(setting, int)
    kept = True if smaller else setting  # an int reshards, to a smaller group
    unit = Unit(owners, group, kept, policy, replicate) if owners else None
    if unit is not None and smaller:  # a collective: every rank of the world
        unit.smaller = smaller_group(setting)  # type: ignore[arg-type]
    _mark_roots(module, unit)
    UNITS[module] = unit  # type: ignore[assignment]  (None: nothing of its own)
    REPLACED.update({id(p): p for p in full})
    if unit is not None:
        module.register_forward_pre_hook(unit.before_forward)
        module.register_forward_hook(unit.after_forward)
    methods = (
        set_modules_to_forward_prefetch,
        set_modules_to_backward_prefetch,
        set_requires_gradient_sync,
    )
    for method in methods:
        setattr(module, method.__name__, functools.partial(method, module))
    return module


def _mark_roots(module: nn.Module, unit: Unit | None) -> None:
    """Units inside `module` are no longer roots; `unit` is one unless an earlier
    unit's module holds `module` (torch decides the root at the first forward: the
    outermost sharded module, the same one when units are made inside out)."""
    inner = set(module.modules())
    for m, other in UNITS.items():
        if other is not None and m in inner:
            other.root = False
    if unit is not None:
        unit.root = not any(module in set(m.modules()) for m in UNITS)


def set_requires_gradient_sync(module: nn.Module, requires: bool) -> None:
    """FSDP2's `FSDPModule.set_requires_gradient_sync`: with False, the backward of
    `module`'s units (itself and those inside it) sends nothing; their full
    gradients stay and the next backward adds to them. The backward after
    setting True reduce-scatters the sum once. No collective here."""
    if not isinstance(requires, bool):
        raise ValueError(
            f"set_requires_gradient_sync: requires must be a bool, got {requires!r}"
        )
    if module not in UNITS:
        raise ValueError(
            "set_requires_gradient_sync: this "
            f"{type(module).__name__} is not a fully_shard unit"
        )
    for unit in units(module):
        unit.sync = requires


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
    """The shard group of a 1-D or 2-D mesh within the world (None: the world)."""
    return groups_of(mesh)[0]


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
    all-gather before forward, again before backward if it resharded (in
    `param_dtype`), and its reduce-scatter (in `reduce_dtype`), each (N - 1) x its
    padded segment; a gather over a smaller group of k, (k - 1) x N / k segments.
    Sharded over the world: no HSDP all-reduce counted."""
    total = 0
    for unit in sharded:
        size = unit.buffer.element_size()  # the forward's gather
        size += torch.empty(0, dtype=unit.reduce_dtype).element_size()
        again = (world - 1) * unit.width * unit.buffer.element_size()
        if unit.smaller is not None:  # over k ranks, each bringing N / k segments
            k = dist.get_world_size(unit.smaller)
            again = (k - 1) * (world // k) * unit.width * unit.buffer.element_size()
        total += (world - 1) * unit.width * size
        total += again if unit.reshard_after_forward else 0
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


def local_pieces(model: nn.Module, full: dict[str, Tensor]) -> dict[str, Tensor]:
    """This rank's piece of each full tensor in `full` (keyed as
    `model.named_parameters()`: e.g. one process's gradients), cut as `fully_shard`
    cut the parameters; a parameter outside every unit stays whole. No collective:
    what compares a rank's sharded gradients with one process's."""
    cut = {
        id(s): pc
        for u in units(model)
        for pc, s in zip(u.pieces, u.sharded, strict=True)
    }
    return {
        name: cut[id(p)].cut(full[name]) if id(p) in cut else full[name].detach()
        for name, p in model.named_parameters()
    }

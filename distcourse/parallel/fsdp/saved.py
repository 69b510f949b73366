"""What autograd keeps for backward under DP, ZeRO and FSDP, by kind, and its formula.

Between forward and backward autograd holds every tensor an op saved for its
backward. Chapter 4's `tensor.saved_activation_bytes` counts those with
`torch.autograd.graph.saved_tensors_hooks` and leaves parameters out. Under FSDP
that is not enough: a Linear inside a unit saves its weight to compute its input's
gradient, and that weight is no parameter of the module but a view of the unit's
all-gather buffer (`unit.Unit`), the full weight, padded. So `saved_bytes` sorts each
saved storage, counted once with its whole size, into

- activations: what the ops computed (and the input), the same under every stage;
- parameters: module parameters (DP, ZeRO-1, ZeRO-2: the whole weights, held
  anyway, so no extra memory);
- gathered: a unit's all-gather buffer, the bytes it held when saved (FSDP);

and also measures `gathered_peak`, the most bytes of gathered buffers alive at any
save, and `gathered_after`, what every unit's buffer still holds when forward
returns: 0 with `reshard_after_forward=True` (the views stay, the bytes go, and
backward gathers them again), every unit's whole buffer with False, the first
layer's too although autograd saved no weight of it (its input needs no gradient).

`saved_formula` is what these must be for a Sequential of Linear layers and
elementwise activations that save their output (Tanh), per rank, `rows` rows each:
each Linear saves its input (the first: the batch itself; the others: the
activation's output, the same storage), 4 x rows x in_features bytes; every Linear
but the first also saves its weight (its input needs a gradient; the batch needs
none), so a unit's buffer, N x its padded share of the unit's weight and bias,
under FSDP.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distcourse.parallel.fsdp.api import units
from distcourse.parallel.fsdp.layout import pieces
from distcourse.parallel.fsdp.unit import Unit

KINDS = ("activations", "parameters", "gathered", "gathered_peak", "gathered_after")


def saved_bytes(net: nn.Module, x: Tensor) -> tuple[dict[str, int], Tensor]:
    """Run `net(x)` under saved-tensor hooks: (bytes by kind, the output).

    The output is returned with its graph, so a backward may follow (it must, for
    an FSDP model that does not reshard: its buffers stay gathered until then).
    """
    sharded = units(net)
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    counts = dict.fromkeys(KINDS, 0)
    seen: set[int] = set()  # storages alive until backward: addresses stay unique
    saved_units: list[Unit] = []

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        live = _live_bytes(sharded)
        counts["gathered_peak"] = max(counts["gathered_peak"], live)
        # a freed buffer's old address may come back for a later tensor: match
        # buffers by their unit, now, before any address seen
        owner = next((u for u in sharded if _is_buffer(u, key)), None)
        if owner is not None:
            if all(u is not owner for u in saved_units):
                saved_units.append(owner)
                counts["gathered"] += size
        elif size and key not in seen:
            seen.add(key)
            counts["parameters" if key in params else "activations"] += size
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = net(x)
    counts["gathered_after"] = _live_bytes(sharded)  # held, saved by autograd or not
    return counts, out


def saved_formula(
    model: nn.Sequential,
    rows: int,
    world: int | None = None,
    reshard_after_forward: bool = True,
) -> dict[str, int]:
    """`saved_bytes` of `model` (the one-process model, before any sharding) run on
    `rows` rows per rank: whole parameters when `world` is None (DP, ZeRO-1,
    ZeRO-2), else FSDP on `world` ranks with one unit per Linear."""
    linears = [m for m in model if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("saved_formula: the model has no Linear layer")
    size = linears[0].weight.element_size()
    out = dict.fromkeys(KINDS, 0)
    out["activations"] = size * rows * sum(m.in_features for m in linears)
    later = linears[1:]  # their inputs need a gradient: their weights are saved
    if world is None:
        out["parameters"] = sum(size * m.weight.numel() for m in later)
        return out
    buffers = [unit_buffer_bytes(m, world) for m in linears]
    out["gathered"] = sum(buffers[1:])
    if reshard_after_forward:
        out["gathered_peak"] = max(buffers[1:], default=0)
    else:
        out["gathered_peak"] = sum(buffers) if later else 0
        out["gathered_after"] = sum(buffers)
    return out


def unit_buffer_bytes(module: nn.Module, world: int) -> int:
    """Bytes of the all-gather buffer of a unit made of `module`'s parameters (the
    unsharded module) on `world` ranks: world x each piece padded to ceil(d0 / N)
    rows."""
    params = list(module.parameters())
    layout = pieces([p.shape for p in params], world, 0)
    return world * sum(p.padded for p in layout) * params[0].element_size()


def _is_buffer(unit: Unit, key: int) -> bool:
    storage = unit.buffer.untyped_storage()
    return storage.nbytes() > 0 and storage.data_ptr() == key


def _buffer_bytes(unit: Unit) -> int:
    return unit.buffer.untyped_storage().nbytes()


def _live_bytes(sharded: list[Unit]) -> int:
    return sum(_buffer_bytes(u) for u in sharded)

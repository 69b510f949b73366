"""FSDP prefetch on real gloo ranks: with forward and backward prefetch the model
trains to exactly the parameters it reaches without (3 SGD steps, bit for bit), the
ledger records the same all-gathers and the same bytes (a prefetched gather is
consumed, never made twice), the overlap measure is 0 without prefetch, and a module
that is not a unit, or a gather prefetched across an optimizer step, is refused.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from spawned import on_ranks
from torch import nn

from distcourse.comm.ledger import Ledger
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel.fsdp import (
    Unit,
    fully_shard,
    hidden_fraction,
    set_modules_to_forward_prefetch,
    units,
)


def _sharded(prefetch: bool) -> nn.Sequential:
    """The chapter's uneven MLP, each Linear a unit, then the root; with `prefetch`
    each layer gathers the next in forward (a method, as FSDP2's) and the previous
    in backward."""
    model = ex.uneven_mlp()
    layers = list(model[::2])
    for module in [*layers, model]:
        fully_shard(module)
    if prefetch:
        for before, after in zip(layers, layers[1:], strict=False):
            before.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([before])
    return model


def _launched_early(unit: Unit) -> int:
    """How many of the unit's gathers were launched before its unshard needed them."""
    spans = {e.name: e for e in unit.timeline}
    return sum(
        spans[f"all_gather {k}"].start < spans[f"unshard {k}"].start
        for k in range(unit.gathers)
    )


def _run() -> dict[object, object]:
    rank = dist.get_rank()
    out: dict[str, object] = {}
    for prefetch in (False, True):
        model = _sharded(prefetch)
        opt = ex.optimizer("SGD", model.parameters())
        with Ledger() as ledger:
            ex.train(model, opt, rank, steps=3)
        out[prefetch] = {
            "params": [p.detach().clone() for p in model.parameters()],
            "bytes": ledger.bytes_sent(),
            "gathers": sum("all_gather" in r.op for r in ledger.records),
            "pending": [u.pending is not None for u in units(model)],
            "early": sum(_launched_early(unit) for unit in units(model)),
            "hidden": hidden_fraction(model),
            "cleared": hidden_fraction(model),
        }
    return out


runs = on_ranks(_run, 2, 4, timeout=60)


def test_prefetch_trains_to_the_same_parameters_bit_for_bit(runs: list) -> None:
    for out in runs:
        for off, on in zip(out[False]["params"], out[True]["params"], strict=True):
            assert torch.equal(off, on)


def test_prefetch_moves_the_same_bytes_in_the_same_gathers(runs: list) -> None:
    for out in runs:
        assert out[True]["bytes"] == out[False]["bytes"] > 0
        # 3 units x (before forward + before backward) x 3 steps: none made twice
        assert out[True]["gathers"] == out[False]["gathers"] == 18
        assert not any(out[True]["pending"])  # every prefetched gather was consumed
        # launched early in the last step (the timeline keeps one): layers 2 and 3
        # in forward, 1 and 2 in backward
        assert (out[False]["early"], out[True]["early"]) == (0, 4)


def test_overlap_is_zero_without_prefetch_and_a_fraction_with(runs: list) -> None:
    for out in runs:
        assert out[False]["hidden"] == 0.0
        assert 0.0 <= out[True]["hidden"] <= 1.0
        assert out[True]["cleared"] == 0.0  # the timeline was cleared by the call


def _refused() -> list[str]:
    model = _sharded(prefetch=False)
    messages = []
    for call in (
        lambda: set_modules_to_forward_prefetch(model[0], [model[1]]),  # a Tanh
        lambda: set_modules_to_forward_prefetch(nn.Linear(2, 2), [model[2]]),
        lambda: model[0].set_modules_to_backward_prefetch([nn.Linear(2, 2)]),
        lambda: set_modules_to_forward_prefetch(model, [model[0]]),  # no own params
    ):
        try:
            call()
        except ValueError as err:
            messages.append(str(err))
    # a gather launched by the last backward is used by the next forward, after the
    # optimizer step changed the pieces: refused, not used stale
    model[0].set_modules_to_backward_prefetch([model[4]])
    try:
        ex.train(model, ex.optimizer("SGD", model.parameters()), dist.get_rank())
    except RuntimeError as err:
        messages.append(str(err))
    return messages


def test_a_module_that_is_not_a_unit_or_a_stale_gather_is_refused() -> None:
    for messages in spawn(_refused, 2, timeout=60):
        assert len(messages) == 5
        assert "Tanh is not a fully_shard unit" in messages[0]
        assert "Linear is not a fully_shard unit" in messages[1]
        assert "not a fully_shard unit" in messages[2]
        assert "no parameters of its own" in messages[3]
        assert "changed after its all-gather was prefetched" in messages[4]

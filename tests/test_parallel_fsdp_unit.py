"""FSDP's gather and reduce-scatter buffers (distcourse/parallel/fsdp/unit.py) live on
the rank's device: on 2 emulated GPU ranks, a forward and backward with prefetch
allocate no host tensor of a buffer's size and copy none to the device (a pageable
copy of a whole unit per gather would block the host and defeat prefetch)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from distcourse import emulate, runtime, torchcompat
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel.fsdp import fully_shard, units


class HostBuffers(TorchDispatchMode):
    """Records every op that makes a host tensor of at least `numel` elements, or
    copies one to the device."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.seen = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        host_in = [
            a
            for a in args
            if isinstance(a, torch.Tensor) and not emulate.is_device_tensor(a)
        ]
        outs = out if isinstance(out, tuple | list) else [out]
        for t in outs:
            if not isinstance(t, torch.Tensor) or t.numel() < self.numel:
                continue
            if not emulate.is_device_tensor(t):
                self.seen.append(f"{func} made a host tensor of {t.numel()}")
            elif host_in and any(h.numel() >= self.numel for h in host_in):
                self.seen.append(f"{func} copied {t.numel()} from the host")
        return out


def _step(plant: bool) -> list[str]:
    device = runtime.device()
    model = ex.uneven_mlp().to(device)
    layers = list(model[::2])
    for module in [*layers, model]:
        fully_shard(module)
    for before, after in zip(layers, layers[1:], strict=False):
        before.set_modules_to_forward_prefetch([after])
    smallest = min(u.world * u.width for u in units(model))
    x, y = ex.batch(0, dist.get_rank())
    x, y = x.to(device), y.to(device)
    with HostBuffers(smallest) as watch:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if plant:  # the negative control: the old way, a host buffer copied over
            torch.empty(smallest).to(device)
    return watch.seen


@pytest.mark.skipif(
    not torchcompat.PYTHON_GROUP_COALESCING,
    reason="torch < 2.14: the emulated group's gather of a device tensor meets "
    "'No backend type associated with device type cpu' "
    "(torchcompat.PYTHON_GROUP_COALESCING)",
)
def test_gathers_and_reduce_scatters_allocate_on_the_device() -> None:
    clean = spawn(_step, 2, False, backend="emulated", timeout=60)
    assert clean == [[], []]
    planted = spawn(_step, 2, True, backend="emulated", timeout=60)
    assert all(len(seen) == 2 for seen in planted), planted  # made, then copied

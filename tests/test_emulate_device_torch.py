"""torch's production modules on emulated GPU ranks (issue 36 item 3): DDP, DTensor
(`distribute_tensor`, `redistribute`, `parallelize_module`), `fully_shard` and
`torch.distributed.pipelining` run on 2 emulated ranks, their tensors stay on each
rank's `gpu:<rank>`, and their numbers equal a one-process CPU run's. Every rank gets
the same batch, so an average over ranks is exactly the one-process value."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from distcourse import emulate, runtime, torchcompat
from distcourse.launch import spawn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))


def _batch() -> torch.Tensor:
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(1))


def _reference() -> tuple[torch.Tensor, list[torch.Tensor]]:
    model = _model()
    out = model(_batch())
    out.sum().backward()
    return out.detach(), [p.grad for p in model.parameters()]


def _on_device(x: torch.Tensor) -> bool:
    return emulate.is_device_tensor(x) and x.device == runtime.device()


def _ddp() -> bool:
    from torch.nn.parallel import DistributedDataParallel

    d = runtime.device()
    model = DistributedDataParallel(_model().to(d))
    out = model(_batch().to(d))
    out.sum().backward()
    want_out, want_grads = _reference()
    grads = [p.grad for p in model.parameters()]
    return (
        all(map(_on_device, grads))
        and torch.equal(out.cpu(), want_out)
        and all(torch.equal(g.cpu(), w) for g, w in zip(grads, want_grads, strict=True))
    )


def _dtensor() -> bool:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(emulate.DEVICE_TYPE, (2,))
    full = torch.arange(8.0, device=runtime.device())
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    whole = sharded.redistribute(mesh, [Replicate()]).to_local()
    mine = sharded.to_local()
    rank = dist.get_rank()
    return (
        _on_device(mine)
        and mine.cpu().tolist() == [4.0 * rank + i for i in range(4)]
        and whole.cpu().tolist() == list(map(float, range(8)))
    )


def _tensor_parallel() -> bool:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(emulate.DEVICE_TYPE, (2,))
    model = _model().to(runtime.device())
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    model = parallelize_module(model, mesh, plan)
    out = model(_batch().to(runtime.device()))
    out.sum().backward()
    want_out, _ = _reference()
    return _on_device(out) and torch.allclose(out.cpu(), want_out, atol=1e-6)


def _fully_shard() -> bool:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(emulate.DEVICE_TYPE, (2,))
    model = _model().to(runtime.device())
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    out = model(_batch().to(runtime.device()))
    out.sum().backward()
    want_out, want_grads = _reference()
    got = [p.grad.full_tensor() for p in model.parameters()]
    return (
        _on_device(out)
        and torch.equal(out.cpu(), want_out)
        and all(torch.equal(g.cpu(), w) for g, w in zip(got, want_grads, strict=True))
    )


def _pipelining() -> bool:
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    d, rank = runtime.device(), dist.get_rank()
    full = _model()
    stage = nn.Sequential(*list(full)[:2]) if rank == 0 else full[2]
    schedule = ScheduleGPipe(
        PipelineStage(stage.to(d), rank, 2, d), n_microbatches=2, loss_fn=_loss
    )
    if rank == 0:
        schedule.step(_batch().to(d))
        return True
    losses: list[torch.Tensor] = []
    schedule.step(target=torch.zeros(6, 4, device=d), losses=losses)
    want = [_loss(_model()(half), None) for half in _batch().chunk(2)]
    return all(_on_device(x) for x in losses) and all(
        torch.allclose(x.cpu(), w.detach()) for x, w in zip(losses, want, strict=True)
    )


def _loss(y: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    return y.sum()


# torch 2.11 sends fully_shard's all-gather through the c10d op, whose C++ side asks
# the Python group for a cpu backend ("No backend type associated with device type
# cpu"; torchcompat.PYTHON_GROUP_COALESCING): there the emulated box runs it no more
WANTED = ["DDP", "DTensor", "parallelize_module", "pipelining"]
if torchcompat.PYTHON_GROUP_COALESCING:
    WANTED.append("fully_shard")


def _all() -> dict[str, bool]:
    checks = {
        "DDP": _ddp,
        "DTensor": _dtensor,
        "parallelize_module": _tensor_parallel,
        "fully_shard": _fully_shard,
        "pipelining": _pipelining,
    }
    return {name: checks[name]() for name in WANTED}


def test_torch_modules_run_on_emulated_ranks_with_cpu_numbers() -> None:
    for ran in spawn(_all, 2, backend="emulated", timeout=20):
        assert ran == dict.fromkeys(WANTED, True), ran

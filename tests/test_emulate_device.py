"""The emulated GPU (distcourse/emulate/device.py): tensors on `gpu:<i>` computing on
the host, CUDA's same-device error, counted host synchronizations, and two planted
faults on real emulated ranks (a module left on the host, a host tensor fed to a
package layer), each refused with the rule named, on the rank that made it."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from distcourse import emulate, runtime
from distcourse.launch import spawn

emulate.setup()
GPU = torch.device(emulate.DEVICE_TYPE, 0)


def test_setup_is_idempotent_and_names_the_device() -> None:
    emulate.setup()
    assert emulate.enabled()
    assert torch._C._get_privateuse1_backend_name() == emulate.DEVICE_TYPE == "gpu"
    assert torch.get_device_module("gpu").is_available()


def test_factories_and_moves_make_device_tensors() -> None:
    made = [
        torch.randn(3, 4, device=GPU),
        torch.zeros(2, device="gpu"),
        torch.arange(4, device=GPU),
        torch.tensor([1.0, 2.0], device=GPU),
        torch.ones(3).to(GPU),
        torch.ones(3).to("gpu:0", dtype=torch.float64),
    ]
    for t in made:
        assert emulate.is_device_tensor(t) and t.device == GPU, t
    assert torch.tensor([1.0, 2.0], device=GPU).cpu().tolist() == [1.0, 2.0]
    m = nn.Linear(4, 2).to(GPU)
    assert all(emulate.is_device_tensor(p) and p.is_leaf for p in m.parameters())
    assert not emulate.is_device_tensor(torch.ones(1))


def test_host_data_shares_memory_with_the_device_tensor_and_its_views() -> None:
    x = torch.arange(6.0).to(GPU)
    view = x[2:]
    emulate.host_data(x).mul_(10)
    assert view.cpu().tolist() == [20.0, 30.0, 40.0, 50.0]
    w = emulate.wrap(torch.ones(2), 0)
    assert w.device == GPU and emulate.host_data(w).data_ptr() != 0
    with pytest.raises(TypeError):
        emulate.host_data(torch.ones(1))


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def test_training_steps_equal_the_cpu_numbers_bit_for_bit() -> None:
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    dev = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    dev.load_state_dict(cpu.state_dict())
    dev.to(GPU)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    _train(cpu, x, y)
    _train(dev, x.to(GPU), y.to(GPU))
    for a, b in zip(cpu.parameters(), dev.parameters(), strict=True):
        assert b.device == GPU and torch.equal(a, b.cpu())


def test_mixing_with_a_host_tensor_raises_cudas_error() -> None:
    x = torch.randn(3, 4, device=GPU)
    for op in (lambda: x + torch.ones(4), lambda: nn.Linear(4, 2)(x)):
        with pytest.raises(RuntimeError) as err:
            op()
        assert isinstance(err.value, emulate.DeviceRuleError)
        assert (
            "Expected all tensors to be on the same device, but found at least two "
            "devices, gpu:0 and cpu!" in str(err.value)
        )
        assert emulate.RULE_SAME_DEVICE in str(err.value)


def test_a_zero_dim_host_scalar_and_host_indices_mix_fine() -> None:
    x = torch.arange(4.0, device=GPU)
    assert (x * torch.tensor(2.0)).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert x[torch.tensor([0, 3])].cpu().tolist() == [0.0, 3.0]


def test_leaving_the_device_works_and_counts_a_host_sync() -> None:
    x = torch.arange(3.0, device=GPU)
    emulate.reset_host_syncs()
    assert x.cpu().tolist() == [0.0, 1.0, 2.0]
    assert x[1].item() == 1.0
    assert x.tolist() == [0.0, 1.0, 2.0]
    assert bool(x[2] > 1)
    assert x.to("cpu").sum().item() == 3.0  # the sum runs on the host: no sync
    torch.get_device_module("gpu").synchronize()
    assert emulate.host_syncs() == 6
    (x + 1).sum()  # device work alone waits for nothing
    assert emulate.host_syncs() == 6
    with pytest.raises(TypeError, match="Use Tensor.cpu"):
        x.numpy()


def _module_left_on_host() -> None:
    model = nn.Linear(4, 2)  # the fault: never moved to runtime.device()
    model(torch.randn(3, 4, device=runtime.device()))


def _host_tensor_into_package_layer() -> None:
    from distcourse.parallel.tensor.layers import ColumnParallelLinear

    layer = ColumnParallelLinear.from_linear(nn.Linear(4, 8).to(runtime.device()))
    layer(torch.randn(3, 4))  # the fault: the batch stays on the host


FAULTS = [  # each with the place its error names: the line whose op mixed devices
    (_module_left_on_host, "test_emulate_device.py"),
    (_host_tensor_into_package_layer, "parallel/tensor/layers.py"),
]


@pytest.mark.parametrize(("fault", "place"), FAULTS)
def test_planted_faults_are_refused_naming_the_rule(fault, place: str) -> None:
    start = time.monotonic()
    with pytest.raises(runtime.RankError) as err:
        spawn(fault, 2, backend="emulated", timeout=10)
    assert time.monotonic() - start < 30
    text = str(err.value)
    assert "rank " in text and emulate.RULE_SAME_DEVICE in text, text
    assert "found at least two devices, gpu:" in text and "and cpu!" in text, text
    first = text.splitlines()[0]
    assert first.startswith("rank ") and f"{place}:" in first, first


def _rank_view() -> dict:
    d = runtime.device()
    lin = nn.Linear(4, 2).to(d)
    lin(torch.ones(3, 4, device=d)).sum().backward()  # autograd on gpu:1 too
    x = torch.full((2,), float(runtime.require_initialized().rank + 1), device=d)
    torch.distributed.all_reduce(x)
    return {
        "device": str(d),
        "grad": str(lin.weight.grad.device),
        "count": torch.get_device_module("gpu").device_count(),
        "current": torch.get_device_module("gpu").current_device(),
        "sum": x.cpu().tolist(),
    }


def test_each_emulated_rank_owns_gpu_of_its_local_rank() -> None:
    views = spawn(_rank_view, 2, backend="emulated", timeout=10)
    for r, v in enumerate(views):
        assert v == {
            "device": f"gpu:{r}",
            "grad": f"gpu:{r}",
            "count": 2,
            "current": r,
            "sum": [3.0, 3.0],
        }


def test_data_pointers_tell_views_of_one_place_apart_as_on_a_gpu() -> None:
    x = torch.zeros(8, device=GPU)
    assert x[:4].data_ptr() == x.data_ptr() != torch.zeros(8, device=GPU).data_ptr()
    assert x[4:].data_ptr() == x.data_ptr() + 16


def test_moves_between_emulated_gpus_land_where_asked() -> None:
    emulate.rank_device(0, 2)
    x = torch.ones(2, device=GPU)
    assert x.to("gpu:1").device == torch.device("gpu", 1)
    assert torch.zeros_like(x, device="gpu:1").device == torch.device("gpu", 1)
    with pytest.raises(emulate.DeviceRuleError, match="gpu:0 and gpu:1"):
        x + x.to("gpu:1")


def test_copies_pickles_and_checkpoints_keep_device_and_values() -> None:
    import copy
    import io
    import pickle

    m = nn.Linear(3, 2).to(GPU)
    twin = copy.deepcopy(m)
    for a, b in zip(m.parameters(), twin.parameters(), strict=True):
        assert b.shape == a.shape and b.device == GPU and torch.equal(a.cpu(), b.cpu())
        assert isinstance(b, nn.Parameter) and b.requires_grad
    x = torch.arange(4.0, device=GPU)
    assert pickle.loads(pickle.dumps(x)).cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    buffer = io.BytesIO()
    torch.save(m.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer)  # weights_only, as torch's default
    assert all(v.device == GPU for v in state.values())
    buffer.seek(0)
    assert all(v.device.type == "cpu" for v in torch.load(buffer, "cpu").values())
    buffer.seek(0)  # map_location on the device: chapter 1 loads its checkpoint so
    assert all(v.device == GPU for v in torch.load(buffer, GPU).values())


def test_reshaping_a_device_tensor_in_place_shows_through() -> None:
    """resize_ (all_gather_object pads its bytes so) and set_ (a view of another
    tensor's storage, as the FSDP chapter's parameters are) change the wrapper too."""
    grown = torch.zeros(2, device=GPU)
    assert grown.resize_(4).shape == (4,) and grown.device == GPU
    buffer = torch.arange(12.0, device=GPU)
    view = torch.empty(0, device=GPU)
    view.set_(buffer.untyped_storage(), 2, (2, 3), (3, 1))
    assert view.shape == (2, 3) and view.stride() == (3, 1)
    buffer.add_(1.0)  # the view shares the buffer's memory
    assert view.cpu().tolist() == [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]


def test_a_wrapper_over_a_device_tensor_gets_cpps_gpu0() -> None:
    assert emulate.wrapper_device(torch.device("gpu", 3)) == GPU
    assert emulate.wrapper_device(torch.device("cpu")) == torch.device("cpu")


def test_a_positional_device_argument_lands_on_the_device() -> None:
    """aten.to.device takes the device by position (DTensor's loss_parallel calls
    it); it was taken for a host op's result."""
    x = torch.ops.aten.to.device(torch.ones(2, device=GPU), GPU, torch.float64)
    assert x.device == GPU and x.dtype == torch.float64 and emulate.is_device_tensor(x)
    back = torch.ops.aten.to.device(x, torch.device("cpu"), x.dtype)
    assert back.device.type == "cpu" and not emulate.is_device_tensor(back)


def test_a_module_converted_in_place_computes_in_its_new_dtype() -> None:
    """nn.Module.to(dtype) sets `p.data`: the host data follow the new dtype."""
    layer = nn.Linear(2, 2).to(GPU).to(torch.bfloat16)
    assert emulate.host_data(layer.weight).dtype == torch.bfloat16
    out = layer(torch.ones(1, 2, device=GPU, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.device == GPU

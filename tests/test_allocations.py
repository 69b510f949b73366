"""`allocations.PeakMemory`: the most bytes alive at once, counted on the CPU by a
dispatch mode (each storage once, freed when torch frees it) and read from the
device's allocator elsewhere (the emulated GPU's counters here)."""

from __future__ import annotations

import torch

from distcourse import emulate
from distcourse.allocations import PeakMemory
from distcourse.examples.gpt import GPTConfig, TinyGPT, lm_loss, token_batches


def test_peak_and_end_count_each_storage_while_it_lives() -> None:
    with PeakMemory("cpu") as memory:
        a = torch.empty(1000)  # 4,000 bytes
        b = torch.empty(2000)  # 8,000
        view = b[:10]  # a view: no new storage
        del a
        c = torch.empty(500)  # 2,000, after a is gone
    assert (memory.peak, memory.end) == (12_000, 10_000)
    assert view.numel() + c.numel() == 510


def test_in_place_ops_allocate_nothing() -> None:
    x = torch.zeros(1000)
    with PeakMemory("cpu", held=[x]) as memory:
        x.add_(1).mul_(2)
    assert (memory.peak, memory.end) == (0, 0)


def test_a_held_tensor_freed_or_resized_lowers_the_count() -> None:
    kept, freed = torch.empty(1000), [torch.empty(1000)]
    with PeakMemory("cpu", held=[kept, *freed]) as memory:
        kept.untyped_storage().resize_(0)  # as FSDP frees a gathered buffer
        freed.clear()
        new = torch.empty(1500)  # 6,000 bytes in place of 8,000 freed
    assert (memory.peak, memory.end) == (0, -2_000)
    assert new.numel() == 1500


def test_restart_counts_the_peak_from_now() -> None:
    with PeakMemory("cpu") as memory:
        big = torch.empty(1000)
        del big
        memory.restart()
        small = torch.empty(10)
    assert memory.peak == 40 and small.numel() == 10


def test_a_training_step_peaks_above_its_model_state() -> None:
    """TinyGPT's step holds weights, gradients and AdamW's two moments (16 bytes a
    parameter) and, at its peak, the activations besides."""
    cfg = GPTConfig(vocab=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    ((x, y),) = token_batches(1, 4, cfg)
    with PeakMemory("cpu") as memory:
        model = TinyGPT(cfg)
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            opt.zero_grad(set_to_none=False)
            lm_loss(model(x), y).backward()
            opt.step()
    state = 16 * sum(p.numel() for p in model.parameters())
    assert state < memory.end < state * 1.05 < memory.peak


def test_the_emulated_device_reads_its_allocator() -> None:
    emulate.setup()
    device = torch.device(emulate.DEVICE_TYPE, 0)
    with PeakMemory(device) as memory:
        a = torch.empty(1000, device=device)
        del a
        b = torch.empty(10, device=device)
    assert (memory.peak, memory.end) == (4000, 40)
    assert b.numel() == 10


def test_a_meta_tensor_holds_no_memory() -> None:
    """A model's shape on the meta device (the trainer's twins of other ranks'
    stages) is not memory: its storage only reports the bytes it would hold."""
    with PeakMemory("cpu") as memory:
        shape = torch.nn.Linear(1000, 1000, device="meta")
        real = torch.empty(10)
    assert (memory.peak, memory.end) == (40, 40)
    assert shape.weight.untyped_storage().nbytes() == 4_000_000 and real.numel() == 10

"""What the emulated device counts (distcourse/emulate/counters.py): host syncs, with
their hooks, and bytes of live device storage."""

from __future__ import annotations

import torch

from distcourse import emulate
from distcourse.emulate import counters

emulate.setup()


def test_syncs_count_from_a_reset_and_reach_the_hooks() -> None:
    seen: list[str] = []
    emulate.add_sync_hook(seen.append)
    emulate.reset_host_syncs()
    emulate.count_host_sync("here")
    torch.ones(2, device="gpu").cpu()
    assert emulate.host_syncs() == 2 and seen[-2] == "here"


def test_a_storage_is_counted_once_and_released_with_it() -> None:
    before = counters.memory_allocated()
    x = torch.zeros(256, device="gpu")  # 1 KiB
    _ = (x[1:], x.view(16, 16))
    assert counters.memory_allocated() == before + 1024
    del x, _
    assert counters.memory_allocated() == before

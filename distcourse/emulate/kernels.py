"""What the emulated GPU registers with torch's dispatcher: CUDA's attention and
CUDA's autocast policy.

- Attention (`emulate/attention.py`): `scaled_dot_product_attention` runs the kernel
  CUDA would choose (`distcourse.sdpa`), each keeping what that kernel keeps.
- Autocast (`emulate/autocast.py`): `torch.autocast("gpu", ...)` turns on the
  dispatch key AutocastPrivateUse1, where torch registers no kernel for most ops;
  the emulated device registers CUDA's policy there, read from the installed
  torch's ATen/autocast_mode.h, and a fallthrough for every other op (run in its
  inputs' dtypes, as on CUDA).
"""

from __future__ import annotations

import torch

from distcourse.emulate import attention, autocast

_library: list[torch.library.Library] = []  # kept alive: the registration lives in it
MISSING: list[str] = []  # header entries that name no op of this torch


def register() -> None:
    """Register attention and autocast's policy (idempotent)."""
    if _library:
        return
    aten = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (kept alive below)
    attention.register(aten)
    every_op = torch.library.Library("_", "IMPL")  # noqa: TOR901
    every_op.fallback(torch.library.fallthrough_kernel, autocast.KEY)
    MISSING.extend(autocast.register(aten))
    _library.extend((aten, every_op))

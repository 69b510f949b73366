"""Every difference between the torch versions the package supports, in one place.

The package supports torch 2.11 (what GPU images ship) up to the locked 2.14.1, and
`make test-compat` runs the unit tests under the oldest of them. Where the two behave
differently, the rest of the package calls this module instead of asking torch for
its version or probing for a name, so each difference is written down once, with the
version it was measured on. The range here is the one `pyproject.toml` declares
(tests/test_torchcompat.py holds the two equal).

Measured, torch 2.11.0 against 2.14.1 (CPU, gloo):

- `torch.distributed.set_timeout` is missing; the `ProcessGroup.set_timeout` method
  it forwards to on 2.14.1 is there, and a group's timeout applies as set.
- A custom `autograd.Function`'s node is held only weakly by its Python object: a
  gradient edge on it outlives its graph only if the graph's root is kept (2.14.1
  keeps it). Not a shim: `pipeline.zero_bubble` keeps the root on every version.
- gloo has no list `all_to_all` (pytorch/pytorch#165435 added it, for 2.12);
  `all_to_all_single` works on both.
- torch's V-shaped schedules (ScheduleZBVZeroBubble, ScheduleDualPipeV) fail on gloo
  ("Pair is not connected") when a rank's two stages pass tensors to each other.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from torch import Tensor

# The versions `pip install distcourse` accepts, and the two `make test` and
# `make test-compat` run the unit tests on. The upper bound is the newest version
# tested: a newer torch may work, but nothing here says it does.
RANGE = ">=2.11,<2.15"
SUPPORTED = SpecifierSet(RANGE)
TESTED = ("2.11.0", "2.14.1")
# The installed torch, without a local label (`2.11.0+cu130` -> 2.11.0).
TORCH = Version(Version(torch.__version__).base_version)


def at_least(version: str, installed: Version = TORCH) -> bool:
    """True if the installed torch (or `installed`) is `version` or newer."""
    return installed >= Version(version)


def is_supported(installed: Version = TORCH) -> bool:
    """True if `installed` (default: this environment's torch) is in SUPPORTED."""
    return installed in SUPPORTED


def support_report(installed: Version = TORCH) -> str:
    """One line for `python -m distcourse check`: the range, and where torch is."""
    verdict = (
        "inside it"
        if is_supported(installed)
        else "OUTSIDE it: install a torch in the range (the lock has one)"
    )
    return (
        f"supported  torch{RANGE} (tested: {', '.join(TESTED)}); "
        f"installed {installed} is {verdict}"
    )


# gloo's list all_to_all (torch.distributed.all_to_all) is there from 2.12.
GLOO_ALL_TO_ALL = at_least("2.12")
# torch's V schedules run on gloo: measured failing on 2.11.0, passing on 2.14.1
# (2.12 and 2.13, untested, are treated as 2.11).
V_SCHEDULES_ON_GLOO = at_least("2.14")
# The emulated NCCL group (emulate.nccl, a Python ProcessGroup): measured on 2.11.0,
# batch_isend_irecv on it is not run as one unit (the eager-size rule fires) and its
# collectives test meets "No backend type associated with device type cpu"; both pass
# on 2.14.1 (2.12 and 2.13, untested, are treated as 2.11).
PYTHON_GROUP_COALESCING = at_least("2.14")


def set_group_timeout(group: dist.ProcessGroup, timeout: timedelta) -> None:
    """Make every later collective on `group` fail after `timeout`.

    `dist.set_timeout(timeout, group)` where torch has it; before that (2.11) the
    `ProcessGroup.set_timeout` method, which the function forwards to.
    """
    setter = getattr(dist, "set_timeout", None)  # the one probe: a missing name
    if setter is not None:
        setter(timeout, group)
    else:
        group.set_timeout(timeout)


def all_gather_tensor(
    output: Tensor, input: Tensor, group: Any = None, async_op: bool = False
) -> Any:
    """All-gather `input` from every rank into `output`, rank by rank along dim 0.

    `dist.all_gather_single` where torch has it (2.14 deprecates
    `all_gather_into_tensor` with a FutureWarning, which would print in chapter
    outputs); before that `all_gather_into_tensor`. Looked up at call time, so a
    `Ledger` active around the call records it.
    """
    gather = getattr(dist, "all_gather_single", None)  # a missing name on 2.11
    if gather is None:
        gather = dist.all_gather_into_tensor
    return gather(output, input, group=group, async_op=async_op)


def reduce_scatter_tensor(output: Tensor, input: Tensor, group: Any = None) -> None:
    """Sum `input` over the ranks and keep this rank's piece in `output`.

    `dist.reduce_scatter_single` where torch has it, else `reduce_scatter_tensor`:
    as `all_gather_tensor`.
    """
    scatter = getattr(dist, "reduce_scatter_single", None)
    if scatter is None:
        scatter = dist.reduce_scatter_tensor
    scatter(output, input, group=group)

"""Small helpers the test files share (imported as `helpers`: pytest puts tests/ on
the path, as tests/ is not a package).

- `ints`: small integer-valued float64 inputs, so that sums in any order are exact
  and a sharded result can be compared with one process by equality;
- `linear`: F.linear with the weight and bias as positional inputs, so that an op
  table can give each its own SBP;
- `assert_refused`: every case of `checks.outcomes` raised, and the errors say what
  a reader needs;
- `torchrun`: the arguments after `python` that start torchrun on this machine with
  a free port of its own, never torchrun's default 29500, which two test runs at
  once would share.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from distcourse.launch.script import free_port
from distcourse.rendezvous import LOOPBACK


def ints(shape: tuple[int, ...], seed: int) -> Tensor:
    """Integers in [-4, 4] as float64, the same for a seed on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=gen).to(torch.float64)


def linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return F.linear(x, w, b)


def assert_refused(lines: list[str], *words: str) -> None:
    """`lines` from checks.outcomes: no case ended without an error, and the errors
    together contain each of `words`."""
    text = "\n".join(lines)
    assert "no error" not in text, text
    for w in words:
        assert w in text, (w, text)


def torchrun(ranks: int) -> list[str]:
    """`-m torch.distributed.run` for `ranks` processes on this machine, with its
    rendezvous on a loopback port that nothing listens on now."""
    return [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "--master-addr",
        LOOPBACK,
        "--master-port",
        str(free_port()),
    ]

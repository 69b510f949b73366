"""The debug view: each op on global tensors, the signature chosen, the boxing inserted.

    with gt.debug() as log:
        loss = model(x).sum()
    print(log)

Lines look like `aten.mm  S(0) x B -> S(0)` and, for a conversion,
`  box arg 1: P -> B  all_reduce on mesh dim 0`. The backward's ops appear too:
autograd runs above __torch_dispatch__, so the backward is global ops as well.
`log.backward()` keeps only the lines recorded while autograd ran a backward node
(found with torch._C._current_autograd_node), `log.forward()` the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_LOGS: list[DebugLog] = []


class DebugLog:
    """The lines recorded while a `debug()` block was active."""

    def __init__(self, echo: bool) -> None:
        self.lines: list[str] = []
        self.in_backward: list[bool] = []
        self.echo = echo

    def add(self, line: str, backward: bool = False) -> None:
        self.lines.append(line)
        self.in_backward.append(backward)
        if self.echo:
            print(line)

    def ops(self) -> list[str]:
        """The op lines only (no boxing lines)."""
        return [ln for ln in self.lines if not ln.startswith(" ")]

    def boxing(self) -> list[str]:
        """The boxing lines only, stripped."""
        return [ln.strip() for ln in self.lines if ln.startswith(" ")]

    def forward(self) -> list[str]:
        """The lines recorded outside autograd's backward."""
        return [ln for ln, b in zip(self.lines, self.in_backward, strict=True) if not b]

    def backward(self) -> list[str]:
        """The lines recorded while autograd ran the backward: its ops, their
        signatures, the boxing they needed and the gradients boxed into leaves."""
        return [ln for ln, b in zip(self.lines, self.in_backward, strict=True) if b]

    def select(self, word: str, backward: bool = True) -> list[str]:
        """The op lines containing `word` with the boxing lines under them, and
        every gradient boxed into a leaf (of the backward, or of the forward)."""
        out, keep = [], False
        for line in self.backward() if backward else self.forward():
            if not line.startswith(" "):
                keep = word in line
            elif "into a leaf" in line:
                keep = True
            if keep:
                out.append(line)
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines)


@contextmanager
def debug(echo: bool = False) -> Iterator[DebugLog]:
    """Record (and with `echo`, print) every global op and boxing in the block."""
    log = DebugLog(echo)
    _LOGS.append(log)
    try:
        yield log
    finally:
        _LOGS.remove(log)


def active() -> bool:
    """Whether any debug block is recording (callers skip formatting otherwise)."""
    return bool(_LOGS)


def record(line: str) -> None:
    """Add a line to every active log, marked if autograd is running a backward."""
    backward = torch._C._current_autograd_node() is not None
    for log in _LOGS:
        log.add(line, backward)

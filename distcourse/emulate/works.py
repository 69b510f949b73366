"""The works an emulated NCCL op returns: its results held back until `wait()`.

A `HeldWork` holds the `completion.Pending` records of one op (or of several: a
coalesced call, a `batch_isend_irecv`), and, for point-to-point ops, the unit that
runs them on the group's emulated stream. `wait()` blocks until that unit has run
(raising a rule's error from it), then writes the results into the op's outputs and
frees its inputs (`completion.complete`). `get_future()` does the same first and
returns a completed future: torch runs a future's `.then()` callbacks with streams
synchronized with the work (docs of `torch.futures.Future.then`), so what a callback
reads is valid, as on a GPU.
"""

from __future__ import annotations

from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from distcourse.emulate import completion


class HeldWork(dist._Work):
    """A work whose results are written in when it is waited for."""

    def __init__(
        self,
        held: list[completion.Pending],
        result: list,
        unit: Future | None = None,
    ) -> None:
        super().__init__()
        self._held = held
        self._result = result
        self._unit = unit

    @staticmethod
    def joined(works: list[HeldWork]) -> HeldWork:
        """One work for several (a coalesced call): waiting for it waits for all."""
        held = [p for w in works for p in w._held]
        return HeldWork(held, [t for w in works for t in w._result])

    def _complete(self) -> None:
        if self._unit is not None:
            for send in self._unit.result():  # raises the rule's error, if any
                send.wait()
        for pending in self._held:
            completion.complete(pending)

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._complete()
        return True

    def is_completed(self) -> bool:
        """Never blocks, as NCCL's query does: False while the unit runs or one of
        its sends is still in flight (it completes when its receive runs); True
        once all are done (the results written in), or when the unit failed
        (`wait()` raises its error)."""
        if self._unit is not None:
            if not self._unit.done():
                return False
            if self._unit.exception() is not None:
                return True
            if not all(send.is_completed() for send in self._unit.result()):
                return False
        self._complete()
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        try:
            self._complete()
        except Exception as error:  # noqa: BLE001 (handed to the future's waiter)
            future.set_exception(error)
            return future
        future.set_result(self._result)
        return future

    def result(self) -> Any:
        return self._result

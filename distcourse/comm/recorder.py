"""A small flight recorder: the last calls each rank entered, kept where a crash leaves
them.

When a distributed job hangs or dies, the question is what each rank was doing: which
collective it entered last, with which shapes, and whether that call ever returned.
PyTorch's Flight Recorder answers it for NCCL (`TORCH_NCCL_TRACE_BUFFER_SIZE`); this
one answers it on any backend, built on the ledger (comm/ledger.py): every
`torch.distributed` call the ledger sees becomes an Entry (call number, op, tensor,
bytes, peer, group) written *before* the call runs, and marked once it returns.

Written to a file, line by line and unbuffered, the entries survive what kills the
rank: gloo aborts the process (SIGABRT) when two ranks' sizes disagree, and a peer
may be stopped while it waits. `read_entries` reads them back in the launcher.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from distcourse.comm.ledger import Ledger, Record

# the argument that holds what this rank hands to each call (default: "tensor")
_HANDED = {
    "all_gather_into_tensor": "input_tensor",
    "all_gather_single": "input_tensor",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
    "reduce_scatter_single": "input",
    "all_to_all": "input_tensor_list",
    "all_to_all_single": "input",
    "scatter": "scatter_list",
}


def tensor_text(data: Any) -> str:
    """A tensor (or list of them) as text: 'float32[8, 4]', '2 x float32[3]', ''."""
    if isinstance(data, torch.Tensor):
        kind = str(data.dtype).removeprefix("torch.")
        return f"{kind}[{', '.join(str(n) for n in data.shape)}]"
    if isinstance(data, list | tuple) and data:
        pieces = {tensor_text(t) for t in data}
        if len(pieces) == 1:
            return f"{len(data)} x {pieces.pop()}"
        return " + ".join(tensor_text(t) for t in data)
    return ""


@dataclass(frozen=True)
class Entry:
    """One call a rank entered: its number on that rank, op, tensor and bytes.

    `bytes` is what the call names (ledger.Record.bytes): the message of a send or
    receive, what this rank hands to a collective. `returned` says whether the call
    came back: an entry that never returned is where the rank hung or died.
    """

    seq: int  # 1, 2, ... in the order this rank entered its calls
    op: str  # the torch.distributed function: all_reduce, isend, recv, ...
    kind: str  # "collective", "send" or "recv"
    tensor: str  # e.g. "float32[8, 4]" (tensor_text)
    bytes: int
    peer: int | None  # the other side of a send or receive (a global rank)
    ranks: tuple[int, ...]  # the group's global ranks
    returned: bool = False

    def call(self) -> str:
        """The call without its number or state: 'all_reduce float32[8] (32 B)',
        'recv float32[2, 4] from rank 1 (32 B)'."""
        where = ""
        if self.kind == "send":
            where = f" to rank {self.peer}"
        elif self.kind == "recv":
            where = f" from rank {self.peer}"
        return f"{self.op} {self.tensor or '-'}{where} ({self.bytes:,} B)"

    def describe(self) -> str:
        """'#3 all_reduce float32[8] (32 B), returned' or '..., never returned'."""
        state = "returned" if self.returned else "never returned"
        return f"#{self.seq} {self.call()}, {state}"


class FlightRecorder(Ledger):
    """A Ledger that also keeps the last `keep` calls as Entries, each noted on entry.

    `with FlightRecorder(path) as rec:` records like a Ledger; `rec.entries` are the
    last calls in order, and `rec.waiting()` the one this rank is inside, if any.
    With a `path`, each entry is appended to that file before its call runs (one
    JSON line; a second line when it returns), so a rank that aborts leaves its
    record behind for `read_entries`.
    """

    def __init__(self, path: str | None = None, keep: int = 64) -> None:
        super().__init__()
        self.path = path
        self.recent: deque[Entry] = deque(maxlen=keep)
        self.count = 0
        self.fd: int | None = None

    def __enter__(self) -> FlightRecorder:
        if self.path is not None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            self.fd = os.open(self.path, flags, 0o600)
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @property
    def entries(self) -> list[Entry]:
        """The last calls this rank entered, oldest first."""
        return list(self.recent)

    def waiting(self) -> Entry | None:
        """The call this rank entered and has not come back from, if any."""
        return next((e for e in reversed(self.recent) if not e.returned), None)

    def note(self, **fields: Any) -> None:
        """Append a line of other facts (e.g. how the rank ended) to the file."""
        self._write(fields)

    def entering(self, record: Record, args: dict[str, Any]) -> None:
        self.count += 1
        data = args.get(_HANDED.get(record.op, "tensor"))
        entry = Entry(
            self.count,
            record.op,
            record.kind,
            tensor_text(data),
            record.bytes,
            record.peer,
            record.ranks,
        )
        self.recent.append(entry)
        self._write(asdict(entry))

    def returned(self, record: Record) -> None:
        for i in range(len(self.recent) - 1, -1, -1):
            if not self.recent[i].returned:
                self.recent[i] = replace(self.recent[i], returned=True)
                self._write({"returned": self.recent[i].seq})
                return

    def _write(self, fields: dict[str, Any]) -> None:
        if self.fd is not None:
            os.write(self.fd, (json.dumps(fields) + "\n").encode())


def read_entries(path: str) -> tuple[list[Entry], dict[str, Any]]:
    """The entries a FlightRecorder wrote to `path`, and its other facts (`note`).

    A missing file (a rank that never started recording) gives no entries."""
    entries: dict[int, Entry] = {}
    facts: dict[str, Any] = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return [], facts
    for line in lines:
        try:
            fields = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        if "returned" in fields and "seq" not in fields:
            seq = fields["returned"]
            if seq in entries:
                entries[seq] = replace(entries[seq], returned=True)
        elif "seq" in fields:
            fields["ranks"] = tuple(fields["ranks"])
            entries[fields["seq"]] = Entry(**fields)
        else:
            facts.update(fields)
    return [entries[k] for k in sorted(entries)], facts

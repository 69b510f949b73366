"""Checkpoints of the trainer: DCP, written atomically, loadable on any layout.

`save` writes `<dir>/step_<N>`: the model and AdamW's moments in one-process form
(whole tensors under TinyGPT's names, `state.gather`), each rank's RNG states (the
CPU's, and the GPU's on a GPU) and a `meta.json` (step = data position, the
scheduler, the losses so far, the run's settings). Every rank writes its share with
`torch.distributed.checkpoint.save` (DCP: each tensor once, the replicas
deduplicated) into `<dir>/.tmp_step_<N>`; then rank 0 writes meta.json, flushes it
to disk and renames the folder. A rename within one file system is atomic, so a
crash mid-save leaves a `.tmp_` folder that `latest` never reads, and the last
complete checkpoint stays the newest.

Why one-process form: a checkpoint then knows nothing of the layout that wrote it.
`read` loads every tensor whole on every rank (a TinyGPT is small), and the
trainer cuts them for its own layout (`state.scatter`): 8 ranks' run resumes on 4
in another layout. A model too large for one rank would save DTensor shards
instead (`parallel.fsdp.checkpoint` does, and DCP reshards them on load).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor

from distcourse import runtime
from distcourse.train import state as train_state

PREFIX = "step_"


def step_dir(directory: str | Path, step: int) -> Path:
    """Where the checkpoint after `step` steps lives."""
    return Path(directory) / f"{PREFIX}{step}"


def latest(directory: str | Path) -> Path | None:
    """The newest complete checkpoint in `directory` (a `step_<N>` folder with its
    meta.json), or None."""
    root = Path(directory)
    found = [
        p
        for p in root.glob(f"{PREFIX}*")
        if p.name[len(PREFIX) :].isdigit() and (p / "meta.json").is_file()
    ]
    return max(found, key=lambda p: int(p.name[len(PREFIX) :]), default=None)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(
    directory: str | Path,
    step: int,
    net: train_state.Net,
    meta: dict,
    *,
    after_write: Callable[[], None] | None = None,
) -> Path:
    """Write the checkpoint after `step` steps; a collective over the world.

    `meta` (JSON: the run's settings, scheduler state, losses) goes to meta.json
    with the step. `after_write` runs on every rank after the tensors are written
    and before the rename: a test raises there to crash mid-save."""
    rank = dist.get_rank()
    root, final = Path(directory), step_dir(directory, step)
    tmp = root / f".tmp_{final.name}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed save's leftovers
    dist.barrier()
    tensors = {f"model.{k}": v for k, v in train_state.gather(net).items()}
    adam_step, moments = train_state.moments(net)
    for kind, full in moments.items():
        tensors.update({f"optim.{kind}.{k}": v for k, v in full.items()})
    tensors[f"rng.{rank}"] = torch.get_rng_state()
    if runtime.device().type == "cuda":  # the GPU's generator is its own
        tensors[f"cuda_rng.{rank}"] = torch.cuda.get_rng_state()
    dcp.save(tensors, checkpoint_id=tmp)
    if after_write is not None:
        after_write()
    if rank == 0:
        record = {**meta, "step": step, "adam_step": adam_step}
        with open(tmp / "meta.json", "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)  # the same step saved again
        os.rename(tmp, final)
        _fsync_dir(root)
    dist.barrier()
    return final


@dataclass
class Snapshot:
    """A loaded checkpoint: its meta.json, the model and AdamW's moments in
    one-process form (host tensors), AdamW's step count and this rank's RNG
    states (the CPU's, and the GPU's where the run that saved it had one)."""

    path: Path
    meta: dict
    model: dict[str, Tensor]
    moments: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    rng: Tensor | None = None
    cuda_rng: Tensor | None = None  # saved by a run on GPUs only

    @property
    def step(self) -> int:
        """Steps done before the save: the data position to resume from."""
        return int(self.meta["step"])


def read(path: str | Path) -> Snapshot:
    """Load the checkpoint at `path` on every rank (a collective: DCP's load).
    Each rank takes its own RNG states, or rank 0's if the run had fewer ranks."""
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    sizes = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    rngs = {kind: rng_key(sizes, kind) for kind in ("rng", "cuda_rng")}
    keys = [k for k in sizes if k.split(".")[0] not in rngs or k in rngs.values()]
    tensors = {
        k: torch.empty(tuple(sizes[k].size), dtype=sizes[k].properties.dtype)
        for k in keys
    }
    dcp.load(tensors, checkpoint_id=path)
    model = {
        k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")
    }
    moments: dict[str, dict[str, Tensor]] = {}
    for kind in train_state.MOMENTS:
        head = f"optim.{kind}."
        found = {k[len(head) :]: v for k, v in tensors.items() if k.startswith(head)}
        if found:
            moments[kind] = found
    cuda = tensors[rngs["cuda_rng"]] if rngs["cuda_rng"] else None
    return Snapshot(path, meta, model, moments, tensors[rngs["rng"]], cuda)


def rng_key(saved: Iterable[str], kind: str) -> str | None:
    """This rank's key of RNG `kind` ("rng" or "cuda_rng") among `saved`, or
    rank 0's if the run had fewer ranks; None if that run saved none."""
    for key in (f"{kind}.{dist.get_rank()}", f"{kind}.0"):
        if key in saved:
            return key
    return None

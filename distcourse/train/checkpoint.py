"""Checkpoints of the trainer: sharded DCP, no gather, any layout, atomic, the last k.

`save` writes `<dir>/step_<N>` after step N. Each rank hands DCP
(`torch.distributed.checkpoint.save`) only the tensors it holds, each under a key
that says where it sits in the one-process model: `model.<name>@<offsets>` for a
parameter (or its TP slice, FSDP piece), `optim.<moment>.<name>@<offsets>` for
AdamW's moments (a ZeRO piece's runs of a parameter too: `placement.Box`). No
rank gathers anything; replicas (data parallelism's copies, what every TP rank
holds alike) write the same key and DCP writes it once. Beside them: AdamW's step
count, each rank's RNG states, and a `meta.json` (the step = the data position,
the scheduler, the sampler, the losses, the run's identity).

`load` reads a checkpoint into any layout: each rank lists the saved keys
(DCP's metadata), asks DCP for those that overlap the boxes it holds now, and
copies each overlap into place, checking that every element was found. A run
saved on 8 ranks as 2 x 2 x 2 resumes on 2 as 2 x 1 x 1, each rank reading only
the saved pieces it needs.

Atomic: every rank writes into `<dir>/.tmp_step_<N>`; rank 0 then writes
meta.json, flushes it to disk and renames the folder to a name no checkpoint has
(`step_<N>`, or `step_<N>.1` ... when step N was saved before). A rename within
one file system is atomic, so at every moment the newest complete checkpoint is
whole: a crash mid-save leaves a `.tmp_` folder that `latest` never reads, and a
step saved twice never leaves a window without it. Then all but the newest
`keep` complete checkpoints are removed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor

from distcourse import accelerator, runtime
from distcourse.parallel.hybrid import HybridGPT
from distcourse.parallel.hybrid.placement import Box

PREFIX = "step_"
NAME = re.compile(rf"{PREFIX}(\d+)(?:\.(\d+))?$")
MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's state per parameter, beside "step"
KINDS = {"param": "model.", **{m: f"optim.{m}." for m in MOMENTS}}


def order(path: Path) -> tuple[int, int] | None:
    """(step, repeat) of a checkpoint folder's name, None for another name."""
    m = NAME.match(path.name)
    return (int(m[1]), int(m[2] or 0)) if m else None


def complete(directory: str | Path) -> list[Path]:
    """The complete checkpoints in `directory` (named, with their meta.json),
    oldest first."""
    root = Path(directory)
    found = [
        p for p in root.glob(f"{PREFIX}*") if order(p) and (p / "meta.json").is_file()
    ]
    return sorted(found, key=order)


def latest(directory: str | Path) -> Path | None:
    """The newest complete checkpoint in `directory`, or None."""
    found = complete(directory) if Path(directory).is_dir() else []
    return found[-1] if found else None


def key(kind: str, box: Box) -> str:
    """The DCP key of a tensor of `kind` ("param" or a moment) in `box`."""
    return f"{KINDS[kind]}{box.name}@{','.join(map(str, box.offsets))}"


def parse(name: str) -> tuple[str, str, tuple[int, ...]] | None:
    """(kind, tensor name, offsets) of a key `key` made; None for another key."""
    for kind, prefix in KINDS.items():
        if name.startswith(prefix) and "@" in name:
            tensor, _, at = name[len(prefix) :].rpartition("@")
            return kind, tensor, tuple(int(v) for v in at.split(",") if v)
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def adam_step(net: HybridGPT) -> int:
    """AdamW's step count (0 before the first step, or for SGD)."""
    for state in net.optimizer.state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def save(
    directory: str | Path,
    step: int,
    net: HybridGPT,
    meta: dict,
    *,
    keep: int = 0,
    after_write: Callable[[], None] | None = None,
) -> Path:
    """Write the checkpoint after `step` steps; a collective over the world.
    `keep` > 0 removes all but the newest `keep`. `after_write` runs on every
    rank after the tensors are written and before the rename: a test raises
    there to crash mid-save."""
    rank = dist.get_rank()
    root = Path(directory)
    tmp = root / f".tmp_{PREFIX}{step}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed save's leftovers
    dist.barrier()
    tensors: dict[str, Tensor] = {}
    for kind in KINDS:
        tensors.update({key(kind, box): t.detach() for box, t in net.local(kind)})
    tensors[f"rng.{rank}"] = torch.get_rng_state()
    device_rng = accelerator.rng_state(runtime.device())  # a GPU's is its own
    if device_rng is not None:
        tensors[f"cuda_rng.{rank}"] = device_rng
    dcp.save(tensors, checkpoint_id=tmp)
    if after_write is not None:
        after_write()
    final = root / f"{PREFIX}{step}"
    if rank == 0:
        record = {**meta, "step": step, "adam_step": adam_step(net)}
        with open(tmp / "meta.json", "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        repeat = 0
        while final.exists():  # step N saved before: a new name, never a gap
            repeat += 1
            final = root / f"{PREFIX}{step}.{repeat}"
        os.rename(tmp, final)
        _fsync_dir(root)
        if keep > 0:
            for old in complete(root)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    names = [final.name]
    dist.broadcast_object_list(names, src=0)
    return root / names[0]


@dataclass
class Snapshot:
    """A loaded checkpoint's meta.json, AdamW's step count and this rank's RNG
    states (the CPU's, and the GPU's where the run that saved it had one)."""

    path: Path
    meta: dict
    rng: Tensor | None = None
    cuda_rng: Tensor | None = field(default=None, repr=False)

    @property
    def step(self) -> int:
        """Steps done before the save: the data position to resume from."""
        return int(self.meta["step"])


def ensure_moments(net: HybridGPT, step: int) -> None:
    """AdamW's state for every tensor it steps, as torch makes it lazily (zeros,
    `step` on the device if fused, else on the host), so a load has somewhere to
    copy into. Nothing for SGD."""
    opt = net.optimizer
    if not isinstance(opt, torch.optim.AdamW) or step == 0:
        return
    for group in opt.param_groups:
        on_device = group["fused"] or group["capturable"]
        for p in group["params"]:
            where = p.device if on_device else torch.device("cpu")
            opt.state[p] = dict(
                step=torch.tensor(float(step), dtype=torch.float32, device=where),
                exp_avg=torch.zeros_like(p),
                exp_avg_sq=torch.zeros_like(p),
            )


def meta_of(path: str | Path) -> dict:
    """A checkpoint's meta.json."""
    return json.loads((Path(path) / "meta.json").read_text(encoding="utf-8"))


def load(path: str | Path, net: HybridGPT) -> Snapshot:
    """Read the checkpoint at `path` into `net` (its parameters and AdamW's
    state, whatever layout wrote it); a collective (DCP's load). ValueError if
    a tensor `net` holds is not (wholly) in it."""
    path = Path(path)
    meta = meta_of(path)
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    ensure_moments(net, int(meta.get("adam_step", 0)))
    pieces: dict[tuple[str, str], list[tuple[str, Box]]] = {}
    for name, md in saved.items():
        found = parse(name)
        if found is not None:
            kind, tensor, at = found
            pieces.setdefault((kind, tensor), []).append(
                (name, Box(tensor, (), at, tuple(md.size)))
            )
    plan = []  # (destination, its slices, key, the key's slices)
    for kind in KINDS:
        for box, t in net.local(kind):
            got = 0
            for name, part in pieces.get((kind, box.name), []):
                both = box.overlap(part)
                if both is not None:
                    plan.append((t, both[0], name, both[1]))
                    got += t[both[0]].numel()
            if got != box.numel:
                raise ValueError(
                    f"checkpoint {path.name} lacks part of {kind} {box.name}"
                )
    rank = dist.get_rank()
    rngs = {kind: rng_key(saved, kind, rank) for kind in ("rng", "cuda_rng")}
    wanted = {name for _, _, name, _ in plan} | {k for k in rngs.values() if k}
    buffers = {
        n: torch.empty(tuple(saved[n].size), dtype=saved[n].properties.dtype)
        for n in wanted
    }
    dcp.load(buffers, checkpoint_id=path)
    with torch.no_grad():
        for t, mine, name, theirs in plan:
            t[mine].copy_(buffers[name][theirs])
    cuda = buffers[rngs["cuda_rng"]] if rngs["cuda_rng"] else None
    return Snapshot(path, meta, buffers.get(rngs["rng"] or ""), cuda)


def rng_key(saved: object, kind: str, rank: int) -> str | None:
    """This rank's key of RNG `kind` ("rng" or "cuda_rng") among `saved`, or rank
    0's if the run had fewer ranks; None if that run saved none."""
    for name in (f"{kind}.{rank}", f"{kind}.0"):
        if name in saved:  # type: ignore[operator]
            return name
    return None

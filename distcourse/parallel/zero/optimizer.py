"""ZeRO stages 1 and 2: each rank keeps the optimizer state of its share only.

`ZeroRedundancyOptimizer` takes torch's arguments in torch's order
(`torch.distributed.optim.ZeroRedundancyOptimizer`), so a program written for torch's
runs with the import swapped. Each rank owns whole parameters (`partition.greedy`,
torch's algorithm); `.optim` is a plain `optimizer_class` over those only, so its state
(AdamW: two moments and a step counter per parameter) is about 1/N of the whole.
`step()` steps `.optim`, then every rank broadcasts its updated shard as one flat
tensor, so every rank has every parameter again (torch broadcasts each parameter,
or with `parameters_as_bucket_view` each rank's flat bucket, as here).

Stage 1 expects gradients already averaged (under DDP, as torch's does). Stage 2 is
`reduce_scatter_gradients()`: one reduce-scatter leaves on each rank the averaged
gradients of its own parameters and drops the others, so gradients shrink to 1/N too;
`ShardedDDP` calls it when the last gradient of a backward arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from distcourse import torchcompat
from distcourse.comm.agree import agree_tensors
from distcourse.parallel.zero.partition import Partition

REFUSED = {
    "overlap_with_ddp": "it runs the step inside torch DDP's C++ comm hook, which "
    "our optimizer cannot reach; call step() after backward instead",
}
ACCEPTED = {  # accepted with no effect on what is computed
    "parameters_as_bucket_view": "torch packs each rank's parameters into one flat "
    "bucket to broadcast; here every step already broadcasts one flat tensor per rank",
}


class ZeroRedundancyOptimizer(Optimizer):
    """torch's ZeroRedundancyOptimizer, from scratch: state sharded over the group."""

    def __init__(
        self,
        params: Iterable[Any],
        optimizer_class: type[Optimizer],
        process_group: Any | None = None,
        parameters_as_bucket_view: bool = False,
        overlap_with_ddp: bool = False,
        **defaults: Any,
    ) -> None:
        if overlap_with_ddp:
            raise NotImplementedError(
                "ZeroRedundancyOptimizer: overlap_with_ddp is not supported here: "
                + REFUSED["overlap_with_ddp"]
            )
        self.initialized = False
        super().__init__(params, defaults)
        tensors = [p for g in self.param_groups for p in g["params"]]
        cls = getattr(optimizer_class, "__qualname__", repr(optimizer_class))
        agree_tensors(  # before any collective; also checks optimizer_class first
            "ZeroRedundancyOptimizer",
            [(f"group {g} param {i}", p) for g, i, p in _numbered(self.param_groups)],
            process_group,
            config=dict(
                optimizer_class=cls,
                parameters_as_bucket_view=parameters_as_bucket_view,
                **dict(sorted(defaults.items())),  # the same order on every rank
            ),
            validate=lambda: check_arguments(optimizer_class, tensors),
        )
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.parameters_as_bucket_view = parameters_as_bucket_view
        groups = [g["params"] for g in self.param_groups]
        self.partition = Partition(groups, self.world_size)
        mine = self.partition.by_rank[self.rank]
        local = [
            _with_params(g, p) for g, p in zip(self.param_groups, mine, strict=True)
        ]
        self.optim = optimizer_class(local, **defaults)
        self._consolidated: list[dict[str, Any]] = []
        self.initialized = True

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """As torch's Optimizer before construction ends; refused after."""
        if getattr(self, "initialized", False):
            raise NotImplementedError(
                "ZeroRedundancyOptimizer: add_param_group after construction is not "
                "supported here (it would re-partition every rank's state); pass "
                "every group to the constructor"
            )
        super().add_param_group(param_group)

    # ---------------------------------------------------------------- a step ----

    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> Any:
        """Step this rank's share, then all-gather every rank's updated share."""
        _copy_options(self.param_groups, self.optim.param_groups)  # lr schedulers
        loss = self.optim.step(closure=closure, **kwargs)
        _copy_options(self.optim.param_groups, self.param_groups)
        self.sync_parameters()
        return loss

    def sync_parameters(self) -> None:
        """Each rank broadcasts its updated shard as one flat tensor (all at once).

        Torch's with `parameters_as_bucket_view=True`. An all-gather would need every
        shard padded to the largest: whole parameters split unevenly, and on 4 ranks
        that padding made the step slower than torch's.
        """
        part, group = self.partition, self.process_group
        like = _first(self)
        with torch.no_grad():
            flats, works = [], []
            for r, params in enumerate(part.flat):
                if r == self.rank and params:
                    flat = torch.cat([p.reshape(-1) for p in params])
                else:
                    flat = like.new_empty(part.numel[r])
                src = dist.get_global_rank(group or dist.group.WORLD, r)
                works.append(dist.broadcast(flat, src, group=group, async_op=True))
                flats.append(flat)
            for r, (flat, work) in enumerate(zip(flats, works, strict=True)):
                work.wait()
                if r != self.rank:
                    for p, new in zip(part.flat[r], part.unpack(flat, r), strict=True):
                        p.copy_(new)

    def reduce_scatter_gradients(self) -> None:
        """ZeRO-2: average the gradients into their owners; other ranks drop them.

        Every parameter must have a gradient on every rank (a missing one is zeros).
        """
        part = self.partition
        like = _first(self)
        with torch.no_grad():
            grads = [[_grad(p) for p in mine] for mine in part.flat]
            row = part.row(grads, like)
            out = torch.empty(part.width, dtype=like.dtype, device=like.device)
            torchcompat.reduce_scatter_tensor(out, row.view(-1), self.process_group)
            out /= self.world_size
            owned = part.unpack(out, self.rank)
        for r, mine in enumerate(part.flat):
            for i, p in enumerate(mine):
                p.grad = owned[i].clone() if r == self.rank else None

    # ----------------------------------------------------------- state dicts ----

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather each rank's `.optim` state on group rank `to` (all ranks call it)."""
        _copy_options(self.param_groups, self.optim.param_groups)
        gathered: list[Any] | None = [None] * self.world_size
        if self.rank != to:
            gathered = None
        dst = dist.get_global_rank(self.process_group or dist.group.WORLD, to)
        local = self.optim.state_dict()
        dist.gather_object(local, gathered, dst=dst, group=self.process_group)
        self._consolidated = gathered or []

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: one state per parameter, indexed over every group.

        Only on the rank `consolidate_state_dict` gathered to, as in torch.
        """
        if not self._consolidated:
            raise RuntimeError(
                "Optimizer state has not been consolidated on this rank. Please call "
                f"`consolidate_state_dict(to={self.rank})` on all ranks beforehand "
                "if you meant to save the global state."
            )
        result = super().state_dict()  # the groups, indexed over all parameters
        index = _index(self.param_groups)
        for r, local in enumerate(self._consolidated):
            for k, p in enumerate(self.partition.flat[r]):
                if k in local["state"]:
                    result["state"][index[p]] = local["state"][k]
        result["state"] = dict(sorted(result["state"].items()))
        return result

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the state of this rank's own parameters; every rank calls it."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [
            len(g["params"]) for g in self.param_groups
        ]:
            raise ValueError(
                "ZeroRedundancyOptimizer: the state dict's parameter groups do not "
                "match this optimizer's (sizes differ)"
            )
        index = _index(self.param_groups)
        mine = self.partition.flat[self.rank]
        state = state_dict["state"]
        local = {k: state[index[p]] for k, p in enumerate(mine) if index[p] in state}
        local_groups, at = [], 0
        for group, owned in zip(groups, self.partition.by_rank[self.rank], strict=True):
            local_groups.append({**group, "params": list(range(at, at + len(owned)))})
            at += len(owned)
        self.optim.load_state_dict({"state": local, "param_groups": local_groups})
        _copy_options(groups, self.param_groups)
        _copy_options(self.param_groups, self.optim.param_groups)


def check_arguments(optimizer_class: Any, tensors: list[torch.Tensor]) -> None:
    """TypeError unless `optimizer_class` is an Optimizer class; ValueError unless
    every parameter has one dtype and device (one flat row moves them)."""
    if not (
        isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)
    ):
        raise TypeError(
            "ZeroRedundancyOptimizer: optimizer_class must be a torch.optim.Optimizer "
            f"class such as torch.optim.AdamW, got {optimizer_class!r}"
        )
    kinds = {(p.dtype, p.device) for p in tensors}
    if len(kinds) != 1:
        raise ValueError(
            "ZeroRedundancyOptimizer: every parameter must have one dtype and "
            f"device (one flat row moves them), got {sorted(map(str, kinds))}"
        )


def _numbered(groups: list[dict]) -> list[tuple[int, int, torch.Tensor]]:
    """(group index, index in the group, parameter) of every parameter."""
    return [
        (g, i, p)
        for g, group in enumerate(groups)
        for i, p in enumerate(group["params"])
    ]


def _with_params(group: dict[str, Any], params: list[Any]) -> dict[str, Any]:
    return {**group, "params": params}


def _copy_options(source: list[dict], target: list[dict]) -> None:
    """Every option but the parameters (lr, betas ...) from each group to its twin."""
    for src, dst in zip(source, target, strict=True):
        dst.update({k: v for k, v in src.items() if k != "params"})


def _index(groups: list[dict]) -> dict[torch.Tensor, int]:
    """Each parameter's index in a state dict: counted over every group in order."""
    return {p: i for i, p in enumerate(p for g in groups for p in g["params"])}


def _first(optimizer: ZeroRedundancyOptimizer) -> torch.Tensor:
    return optimizer.param_groups[0]["params"][0]


def _grad(param: torch.Tensor) -> torch.Tensor:
    return param.grad if param.grad is not None else torch.zeros_like(param)

"""A mixture-of-experts layer that runs in one process or across an `ep` group.

    moe = MoE(n_embd=32, n_experts=4, top_k=2, capacity_factor=1.25)
    y = moe(x)                        # one process: every expert here
    shard_experts(moe, group)         # this rank keeps E / ep experts
    y = moe(x_of_this_rank)           # tokens travel to their experts and back

The experts are the tiny GPT's MLP. One process given `groups=G` routes G equal
groups of tokens with G capacities, as G ranks would: the reference that drops
the same tokens as G ranks each routing their own.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse.comm.agree import agree_tensors
from distcourse.examples.gpt import MLP
from distcourse.parallel.experts.dispatch import (
    Group,
    RowsA2A,
    Traffic,
    all_to_all_rows,
    to_experts,
)
from distcourse.parallel.experts.router import Routing, check_router, route


class MoE(nn.Module):
    """Gate (C -> E, no bias), top-k routing with capacity, E MLP experts.

    After a forward: `aux` the load-balancing loss (mean over groups), `load`
    (E,) assignments per expert before drops, `served` (E,) after them, `kept`
    each assignment's flag (slot-major, group by group), `dropped` how many not,
    `traffic` the rows this rank exchanged (None in one process), `routed` the
    kept assignments (expert, token), unsorted. `a2a` moves the rows (an
    attribute, so a test can plant a fault in it).
    """

    def __init__(
        self,
        n_embd: int,
        n_experts: int,
        top_k: int = 1,
        capacity_factor: float = 1.25,
    ) -> None:
        check_router(n_experts, top_k, capacity_factor)
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        self.capacity_factor = capacity_factor
        self.gate = nn.Linear(n_embd, n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(n_embd) for _ in range(n_experts))
        self.first = 0  # global index of experts[0]
        self.group: Group = None
        self.groups = 1  # routing groups in one process (a rank routes its own)
        self.aux = torch.zeros(())
        self.load = torch.zeros(n_experts, dtype=torch.long)
        self.dropped = 0
        self.kept = torch.zeros(0, dtype=torch.bool)
        self.served = torch.zeros(n_experts, dtype=torch.long)
        self.traffic: Traffic | None = None
        self.routed = (torch.zeros(0, dtype=torch.long),) * 2
        self.a2a: RowsA2A = all_to_all_rows

    def route(self, flat: Tensor) -> Routing:
        """Route `groups` equal groups of the tokens (T, C); one Routing for all."""
        logits = self.gate(flat)  # (T, E)
        if flat.shape[0] % self.groups:
            raise ValueError(
                f"{flat.shape[0]} tokens do not split into groups={self.groups}"
            )
        size = flat.shape[0] // self.groups
        parts = [
            route(chunk, self.top_k, self.capacity_factor)
            for chunk in logits.split(size)
        ]
        offsets = [i * size for i in range(len(parts))]
        return Routing(
            torch.cat([p.expert for p in parts]),
            torch.cat([p.token + o for p, o in zip(parts, offsets, strict=True)]),
            torch.cat([p.weight for p in parts]),
            torch.cat([p.kept for p in parts]),
            torch.stack([p.load for p in parts]).sum(dim=0),
            torch.stack([p.aux for p in parts]).mean(),
        )

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (T, C)
        r = self.route(flat)
        expert, token, weight = r.expert[r.kept], r.token[r.kept], r.weight[r.kept]
        self.routed = (expert.detach(), token.detach())
        order = torch.argsort(expert, stable=True)  # rows grouped by expert
        expert, token, weight = expert[order], token[order], weight[order]
        out, self.traffic = to_experts(
            flat[token], expert, self.experts, self.first, self.group, self.a2a
        )
        y = torch.zeros_like(flat).index_add(0, token, weight[:, None] * out)
        self.aux, self.load = r.aux, r.load.detach()
        self.dropped, self.kept = int((~r.kept).sum()), r.kept
        self.served = torch.bincount(r.expert[r.kept], minlength=self.n_experts)
        return y.view(x.shape)


def check_experts(n_experts: int, ep: int) -> None:
    """ValueError unless n_experts splits evenly over ep ranks (no message sent)."""
    if n_experts % ep:
        raise ValueError(f"n_experts={n_experts} is not divisible by ep size {ep}")


def shard_experts(moe: MoE, group: Group = None) -> MoE:
    """Keep this rank's E / ep experts (a contiguous block) and route over `group`
    (None: the world).

    Every rank must start from the same full layer (same seed). Checked before any
    message, alike on every rank (`agree_tensors`, one small all-gather): the layer
    not sharded yet, E divisible by the group's size, and the same configuration
    (E, top_k, capacity) and parameter shapes on every rank; a layer of other
    experts on one rank is a ValueError naming it, not the all_to_all aborting
    (gloo) or hanging (NCCL). Returns `moe`, changed in place.
    """
    n = dist.get_world_size(group)

    def fits() -> None:
        if moe.group is not None or moe.first:
            raise ValueError("these experts are already sharded")
        check_experts(moe.n_experts, n)

    agree_tensors(
        "shard_experts",
        list(moe.named_parameters()),
        group,
        config=dict(
            n_experts=moe.n_experts, top_k=moe.top_k, capacity=moe.capacity_factor
        ),
        validate=fits,
    )
    local = moe.n_experts // n
    moe.first = dist.get_rank(group) * local
    moe.experts = nn.ModuleList(list(moe.experts)[moe.first : moe.first + local])
    moe.group = dist.group.WORLD if group is None else group  # None: one process
    return moe


def global_expert_name(name: str, moe_name: str, moe: MoE) -> str:
    """A sharded parameter's name as one process holding every expert calls it:
    'blocks.0.mlp.experts.1.fc.weight' on a rank whose first expert is 2 ->
    'blocks.0.mlp.experts.3.fc.weight'."""
    head = f"{moe_name}.experts." if moe_name else "experts."
    if not name.startswith(head):
        return name
    index, rest = name[len(head) :].split(".", 1)
    return f"{head}{int(index) + moe.first}.{rest}"

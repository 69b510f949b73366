"""A dropless mixture of experts: every assignment served, experts as one grouped
matmul, the load balanced by a bias instead of an auxiliary loss.

    moe = DroplessMoE(n_embd=16, n_experts=4, top_k=2, n_shared=1,
                      score="sigmoid", balance_rate=1e-2)
    shard_dropless(moe, group)        # E / ep experts per rank, checked first
    y = moe(x)                        # counts, dispatch, grouped experts, combine
    moe.balance()                     # after the step: the bias follows the load

The design of torchtitan's MoE (torchtitan/models/common/moe/moe.py) and of
DeepSeek-V3: no capacity, so no token is dropped and the rows an expert receives
vary from step to step. Its assignments, sorted by expert, form one block per
expert; the experts' weights are stacked, (E, C, H), and one grouped matmul runs
every block against its own expert (`torch._grouped_mm` with the blocks' end
offsets, where this torch runs it on the device and dtype; else a loop over the
blocks: the same numbers). The experts are SwiGLU MLPs, torchtitan's:
w2(silu(x w1) * (x w3)).

Routing: softmax or sigmoid scores; top-k of the scores plus a bias `bias` (E,);
the gate weights are the scores of the chosen experts, never the bias (Wang et
al. 2024, "Auxiliary-Loss-Free Load Balancing", arXiv 2408.15664): the bias only
decides who is chosen. After each step the bias moves towards the experts that
got fewer than the mean load, `rate * sign(mean - load)` centred, torchtitan's
`load_balance_coeff` update. The load is summed over every rank that routes
tokens of its own (all-reduced: the ep group, or under dp x ep the whole
data-parallel mesh, as torchtitan reduces it), so every rank holds the same bias.
Shared experts (DeepSeek-MoE, arXiv 2401.06066) see every token: one SwiGLU
`n_shared` times as wide, added to the routed output.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distcourse import accelerator
from distcourse.arguments import positive_int
from distcourse.comm.agree import agree_tensors
from distcourse.parallel.experts.dispatch import (
    Group,
    RowsA2A,
    Traffic,
    all_to_all_rows,
    exchange_counts,
)

SCORES = ("softmax", "sigmoid")
GroupedMM = Callable[[Tensor, Tensor, Tensor], Tensor]


def _grouped_runs(x: Tensor, w: Tensor) -> bool:
    """Whether torch's grouped matmul takes these operands on their device: torch
    has a `_grouped_mm` kernel there (CUDA's own in torch 2.14, the composite one
    elsewhere; the emulated GPU runs the host's), and the inputs pass the checks
    every device makes (GroupedMMUtils.h `_grouped_mm_validate_inputs`): float32,
    bfloat16 or float16, rows a multiple of 16 bytes (float64 and odd widths
    raise). Elsewhere: the loop over the blocks, with a host sync for their sizes."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    key = accelerator.dispatch_key(x.device)  # a kernel of its own or torch's
    has = torch._C._dispatch_has_computed_kernel_for_dispatch_key  # composite one
    if not has("aten::_grouped_mm", key):
        return False
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    size = x.element_size()
    return (x.shape[1] * size) % 16 == 0 and (w.shape[-1] * size) % 16 == 0


def grouped_mm(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    """Rows x[offs[g-1]:offs[g]] times w[g] for every group g, as one (N, H).

    x (N, C) sorted by group, w (G, C, H), offs (G,) int32 end offsets (the last
    is N). `torch._grouped_mm` where it runs, else a loop over the blocks."""
    if _grouped_runs(x, w):
        return torch._grouped_mm(x, w, offs=offs)
    ends = offs.tolist()  # a host sync: split sizes are Python ints
    sizes = [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    pieces = x.split(sizes)  # an empty piece for an idle expert
    return torch.cat([p @ w[g] for g, p in enumerate(pieces)])


def check_dropless(n_experts: int, top_k: int, n_shared: int, score: str) -> None:
    """ValueError, before any message is sent, for a layer that cannot work."""
    positive_int(n_experts, "n_experts")
    positive_int(top_k, "top_k")
    if top_k > n_experts:
        raise ValueError(f"top_k={top_k} is larger than the {n_experts} experts")
    if n_shared < 0:
        raise ValueError(f"n_shared must be 0 or more, got {n_shared}")
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")


class SwiGLU(nn.Module):
    """A shared expert: w2(silu(x w1) * (x w3)), no biases (torchtitan's)."""

    def __init__(self, n_embd: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(n_embd, hidden, bias=False)
        self.w3 = nn.Linear(n_embd, hidden, bias=False)
        self.w2 = nn.Linear(hidden, n_embd, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DroplessMoE(nn.Module):
    """Gate (C -> E, no bias), top-k routing without capacity, E SwiGLU experts
    stacked as w1, w3 (E, C, H) and w2 (E, H, C), `n_shared` shared experts.

    After a forward: `load` (E,) assignments per expert on this rank, `expert`,
    `token`, `weight` the assignments (slot-major: first choices, then second),
    `scores` (T, E) the router's scores, `traffic` the rows exchanged (None in
    one process). `matmul` and `a2a` are the grouped matmul and the rows'
    all_to_all (attributes, so a test can plant a fault in them).
    """

    def __init__(
        self,
        n_embd: int,
        n_experts: int,
        top_k: int = 1,
        *,
        n_shared: int = 0,
        score: str = "softmax",
        balance_rate: float = 0.0,
        hidden: int | None = None,
    ) -> None:
        check_dropless(n_experts, top_k, n_shared, score)
        super().__init__()
        h = 2 * n_embd if hidden is None else hidden
        self.n_experts, self.top_k, self.n_shared = n_experts, top_k, n_shared
        self.score, self.balance_rate = score, balance_rate
        self.gate = nn.Linear(n_embd, n_experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(n_experts, n_embd, h) / n_embd**0.5)
        self.w3 = nn.Parameter(torch.randn(n_experts, n_embd, h) / n_embd**0.5)
        self.w2 = nn.Parameter(torch.randn(n_experts, h, n_embd) / h**0.5)
        self.shared = SwiGLU(n_embd, h * n_shared) if n_shared else None
        self.register_buffer("bias", torch.zeros(n_experts))
        self.first, self.group = 0, None  # global index of w1[0]; ep group
        self.load_group: Group = None  # every rank of other tokens (dp x ep)
        self.load = torch.zeros(n_experts, dtype=torch.long)
        self.traffic: Traffic | None = None
        self.matmul: GroupedMM = grouped_mm
        self.a2a: RowsA2A = all_to_all_rows

    def select(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(expert, token, weight), each (k*T,) slot-major: top-k of scores + bias,
        weighted by the scores alone (renormalised to sum to 1 when k > 1)."""
        T = logits.shape[0]
        sig = self.score == "sigmoid"
        self.scores = logits.sigmoid() if sig else logits.softmax(dim=-1)  # (T, E)
        _, chosen = (self.scores + self.bias).topk(self.top_k, dim=-1)  # (T, k)
        weight = self.scores.gather(1, chosen)  # (T, k): the bias never weighs
        if self.top_k > 1:
            weight = weight / weight.sum(dim=-1, keepdim=True)
        token = torch.arange(T, device=logits.device).repeat(self.top_k)
        return chosen.t().reshape(-1), token, weight.t().reshape(-1)

    def experts(self, rows: Tensor, counts: Tensor) -> Tensor:
        """This rank's experts on rows sorted by local expert, counts (E_local,)."""
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        h = F.silu(self.matmul(rows, self.w1, offs)) * self.matmul(rows, self.w3, offs)
        return self.matmul(h, self.w2, offs)

    def dispatch(self, rows: Tensor, expert: Tensor) -> tuple[Tensor, Traffic | None]:
        """Rows sorted by global expert -> each row's expert output, same order."""
        local = self.w1.shape[0]
        group = self.group
        if group is None or dist.get_world_size(group) == 1:
            counts = torch.bincount(expert - self.first, minlength=local)
            return self.experts(rows, counts), None
        n = dist.get_world_size(group)
        per_expert = torch.bincount(expert, minlength=n * local)  # (E,)
        incoming = exchange_counts(per_expert, group)  # (n, E/n)
        # .tolist() waits for the device: all_to_all_single takes its split
        # sizes as Python ints, and the output's size must be known to allocate it
        send = per_expert.view(n, local).sum(dim=1).tolist()
        recv = incoming.sum(dim=1).tolist()
        arrived = self.a2a(rows, send, recv, group)  # (sum(recv), C), by source
        ids = torch.arange(local, device=rows.device).repeat(n)
        ids = torch.repeat_interleave(ids, incoming.reshape(-1))
        order = torch.argsort(ids, stable=True)  # by local expert
        out = self.experts(arrived[order], incoming.sum(dim=0))
        back = self.a2a(out[torch.argsort(order)], recv, send, group)
        row_bytes = rows.shape[1] * rows.element_size()
        rank = dist.get_rank(group)
        return back, Traffic(tuple(send), tuple(recv), rank, row_bytes, n * local)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (T, C)
        expert, token, weight = self.select(self.gate(flat))
        self.expert, self.token, self.weight = expert, token, weight
        order = torch.argsort(expert, stable=True)  # rows grouped by expert
        expert, token, weight = expert[order], token[order], weight[order]
        self.load = torch.bincount(expert, minlength=self.n_experts)
        out, self.traffic = self.dispatch(flat[token], expert)
        y = torch.zeros_like(flat).index_add(0, token, weight[:, None] * out)
        if self.shared is not None:
            y = y + self.shared(flat)
        return y.view(x.shape)

    def update_bias(self, load: Tensor) -> None:
        """bias += rate * sign(mean - load), centred (arXiv 2408.15664)."""
        load = load.to(self.bias.dtype)
        delta = self.balance_rate * torch.sign(load.mean() - load)
        self.bias += delta - delta.mean()

    @torch.no_grad()
    def balance(self) -> None:
        """After a step: the load of every rank that routed other tokens (one
        all-reduce of E int64 over `load_group`: the whole data-parallel mesh under
        dp x ep, as torchtitan reduces its tokens per expert; else the ep group),
        then the bias; every such rank updates the same bias. No-op at rate 0."""
        if not self.balance_rate:
            return
        load = self.load.clone()
        group = self.load_group if self.load_group is not None else self.group
        if group is not None:
            dist.all_reduce(load, group=group)
        self.update_bias(load)


def shard_dropless(
    moe: DroplessMoE, group: Group = None, *, data_parallel: Group = None
) -> DroplessMoE:
    """Keep this rank's E / ep experts (a contiguous block of w1, w3, w2) and route
    over `group` (None: the world). `data_parallel`: the group of every rank that
    routes tokens of its own (under dp x ep, all dp x ep ranks), over which
    `balance` sums the load so the bias stays one across replicas (default: `group`).
    Checked before any message, alike on every rank (`agree_tensors`): not sharded
    yet, E divisible by the group's size, the same configuration and parameter
    shapes. Returns `moe`, changed in place."""
    n = dist.get_world_size(group)

    def fits() -> None:
        if moe.group is not None or moe.first:
            raise ValueError("these experts are already sharded")
        if moe.n_experts % n:
            raise ValueError(
                f"n_experts={moe.n_experts} is not divisible by ep size {n}"
            )

    config = dict(
        n_experts=moe.n_experts,
        top_k=moe.top_k,
        n_shared=moe.n_shared,
        score=moe.score,
        rate=moe.balance_rate,
    )
    params = list(moe.named_parameters())
    agree_tensors("shard_dropless", params, group, config=config, validate=fits)
    local = moe.n_experts // n
    moe.first = dist.get_rank(group) * local
    for name in ("w1", "w3", "w2"):
        block = getattr(moe, name)[moe.first : moe.first + local]
        setattr(moe, name, nn.Parameter(block.detach().clone()))
    moe.group = dist.group.WORLD if group is None else group
    moe.load_group = data_parallel
    return moe

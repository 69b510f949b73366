"""The router of a mixture of experts: which expert (or two) each token goes to.

A linear gate scores every token against every expert; softmax gives the router's
probabilities; each token picks its `top_k` best experts (k = 1 is the Switch
Transformer, k = 2 GShard and Mixtral). An expert takes at most `capacity` tokens
from one group of tokens (GShard's groups: on E ranks, each rank's own tokens):

    capacity = ceil(capacity_factor * k * tokens_in_group / experts)

Assignments beyond it are dropped: that token gets nothing from that expert (the
block's residual carries it on). Who comes first is fixed, so a one-process run
with the same groups drops exactly the same tokens: every token's first choice
before any second choice, and within a choice the tokens in order (GShard).

The auxiliary load-balancing loss is the Switch Transformer's,
E * sum_e f_e * P_e, with f_e the share of the group's assignments routed to
expert e (before drops) and P_e the mean router probability of e: it is 1 for a
perfectly even router and grows as the load concentrates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from distcourse.arguments import positive_int


def check_router(n_experts: int, top_k: int, capacity_factor: float) -> None:
    """ValueError, before any message is sent, for a router that cannot work."""
    positive_int(n_experts, "n_experts")
    positive_int(top_k, "top_k")
    if top_k > n_experts:
        raise ValueError(f"top_k={top_k} is larger than the {n_experts} experts")
    if not capacity_factor > 0:
        raise ValueError(
            f"capacity_factor must be positive, got {capacity_factor}: "
            "an expert with no room would drop every token"
        )


def capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """Most assignments one expert takes from a group of `tokens` tokens."""
    return math.ceil(capacity_factor * top_k * tokens / n_experts)


@dataclass
class Routing:
    """Where each of a group's k x T assignments goes, slot-major (every token's
    first choice, then every token's second).

    expert, token: (k*T,) int64; weight: (k*T,) the gate weight (differentiable);
    kept: (k*T,) bool, False where the expert was full; load: (E,) assignments
    before drops; aux: the load-balancing loss of the group (a scalar).
    """

    expert: Tensor
    token: Tensor
    weight: Tensor
    kept: Tensor
    load: Tensor
    aux: Tensor


def route(logits: Tensor, top_k: int, capacity_factor: float) -> Routing:
    """Route one group of tokens from its gate logits (T, E)."""
    T, E = logits.shape
    probs = logits.softmax(dim=-1)  # (T, E)
    top, chosen = probs.topk(top_k, dim=-1)  # (T, k) each
    if top_k > 1:  # the k weights of a token sum to 1 (GShard, Mixtral)
        top = top / top.sum(dim=-1, keepdim=True)
    expert = chosen.t().reshape(-1)  # (k*T,) slot-major
    one_hot = torch.nn.functional.one_hot(expert, E)  # (k*T, E)
    position = (one_hot.cumsum(dim=0) - 1).gather(1, expert[:, None])[:, 0]
    room = capacity(T, E, top_k, capacity_factor)
    load = one_hot.sum(dim=0)  # (E,)
    share = load.to(probs.dtype) / (top_k * T)
    aux = E * (share * probs.mean(dim=0)).sum()
    token = torch.arange(T, device=logits.device).repeat(top_k)
    return Routing(expert, token, top.t().reshape(-1), position < room, load, aux)

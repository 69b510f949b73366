"""TinyGPT with mixture-of-experts blocks, trained data x expert parallel.

Each block's MLP becomes a `MoE` of `n_experts` MLPs. On a (dp, ep) mesh every
rank holds different tokens (the batch splits over dp x ep); the dense weights
(embeddings, attention, norms, gates, head) are replicated on every rank, and an
expert lives on one rank of each ep group, replicated over dp. So:

    dense gradients:  all-reduce over the world, divide by the world
    expert gradients: all-reduce over dp, divide by the world

An expert's gradient already sums the tokens of its whole ep group (the combine's
backward brings them home); what is left is the dp replicas. Summing over dp
without dividing by the world gives every gradient x world: the bug the
equivalence check exists to catch (and AdamW would hide: compare under SGD).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse.comm.agree import agree_tensors
from distcourse.examples.gpt import GPTConfig, TinyGPT, lm_loss
from distcourse.mesh import Mesh
from distcourse.parallel.experts.layer import (
    MoE,
    check_experts,
    global_expert_name,
    shard_experts,
)
from distcourse.parallel.experts.router import check_router


@dataclass(frozen=True)
class MoEConfig:
    """A TinyGPT's sizes and its experts: n_experts per block, top_k, capacity
    factor and the weight of the load-balancing loss."""

    gpt: GPTConfig = GPTConfig()
    n_experts: int = 4
    top_k: int = 1
    capacity_factor: float = 1.25
    aux_weight: float = 0.01

    def __post_init__(self) -> None:
        check_router(self.n_experts, self.top_k, self.capacity_factor)


def moe_gpt(cfg: MoEConfig = MoEConfig()) -> TinyGPT:
    """A TinyGPT whose blocks' MLPs are MoE layers (built from the current seed)."""
    model = TinyGPT(cfg.gpt)
    for block in model.blocks:
        block.mlp = MoE(cfg.gpt.n_embd, cfg.n_experts, cfg.top_k, cfg.capacity_factor)
    return model


def moe_layers(model: nn.Module) -> Iterator[tuple[str, MoE]]:
    """(name, layer) of every MoE in the model."""
    return ((n, m) for n, m in model.named_modules() if isinstance(m, MoE))


def moe_loss(model: nn.Module, x: Tensor, y: Tensor, aux_weight: float) -> Tensor:
    """Next-token loss plus aux_weight x the blocks' load-balancing losses."""
    logits = model(x)  # (B, T, vocab); sets every layer's aux
    aux = sum(m.aux for _, m in moe_layers(model))
    return lm_loss(logits, y) + aux_weight * aux


def as_reference(model: nn.Module, groups: int) -> nn.Module:
    """A one-process copy that routes `groups` groups, as `groups` ranks would."""
    alone = copy.deepcopy(model)
    for _, layer in moe_layers(alone):
        layer.groups = groups
    return alone


def check_mesh(mesh: Mesh, n_experts: int) -> None:
    """ValueError unless the mesh has dp and ep axes (any other of size 1) and the
    experts divide over ep. No message is sent."""
    others = [a for a in mesh.names if a not in ("dp", "ep") and mesh.size(a) > 1]
    if not {"dp", "ep"} <= set(mesh.names) or others:
        raise ValueError(f"dp x ep needs a mesh with axes dp and ep, got {mesh.names}")
    check_experts(n_experts, mesh.size("ep"))


def parallelize(model: nn.Module, mesh: Mesh) -> nn.Module:
    """Shard every MoE layer's experts over the mesh's ep axis, in place.

    First the world agrees on the model's parameter names, shapes and dtypes (one
    small all-gather): `average_gradients` all-reduces them as flat buffers, and
    `shard_experts` agrees only within each ep group."""

    def fits() -> None:
        for _, layer in moe_layers(model):
            check_mesh(mesh, layer.n_experts)

    agree_tensors("parallelize", list(model.named_parameters()), validate=fits)
    for _, layer in moe_layers(model):
        shard_experts(layer, mesh.group("ep"))
    return model


def is_expert(name: str) -> bool:
    """Whether a parameter belongs to an expert (held by one rank of each ep group)."""
    return ".experts." in f".{name}"


def global_names(model: nn.Module) -> dict[str, str]:
    """Each local parameter's name -> its name in the one-process model."""
    names = {n: n for n, _ in model.named_parameters()}
    for moe_name, layer in moe_layers(model):
        for n in names:
            names[n] = global_expert_name(names[n], moe_name, layer)
    return names


def _all_reduce(grads: list[Tensor], group: dist.ProcessGroup | None, n: int) -> None:
    """Sum the gradients over `group` in one flat message, then divide by n."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= n
    for g, piece in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(piece.view_as(g))


def average_gradients(model: nn.Module, mesh: Mesh) -> None:
    """Dense gradients averaged over the world; experts' summed over dp, / world."""
    world = dist.get_world_size()
    params = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    _all_reduce([p.grad for n, p in params if not is_expert(n)], None, world)
    _all_reduce([p.grad for n, p in params if is_expert(n)], mesh.group("dp"), world)

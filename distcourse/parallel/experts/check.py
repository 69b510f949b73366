"""Expert parallelism against one process: the chapter's checks, as functions.

Every rank of the group calls them. `layer_against_one_process` runs one MoE layer
over an ep group and the same layer alone (routing the same groups, so capacity
drops the same tokens) and compares outputs, the loss, gradients, the dropped
assignments and the ledger's bytes against a formula counted from the one
process's routing of the whole batch (not from the split sizes the ranks sent).
`model_against_one_process` trains a MoE TinyGPT on a (dp, ep) mesh and alone
with SGD, and compares the first step's gradients and the parameters after the
last. `lines` prints the verdicts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse import checks, runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import token_batches
from distcourse.mesh import Mesh
from distcourse.parallel.experts import cost
from distcourse.parallel.experts.layer import MoE, shard_experts
from distcourse.parallel.experts.model import (
    MoEConfig,
    as_reference,
    average_gradients,
    global_names,
    moe_gpt,
    moe_layers,
    moe_loss,
    parallelize,
)
from distcourse.parallel.experts.router import capacity

TOL = 1e-5  # float32 sums in another order differ by about 1e-7
AUX_WEIGHT = 0.01


def _layer_loss(moe: MoE, x: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """(output, MSE against target + AUX_WEIGHT x the load-balancing loss)."""
    y = moe(x)
    return y, ((y - target) ** 2).mean() + AUX_WEIGHT * moe.aux


def skewed_inputs(
    moe: nn.Module, skew: float, shape: tuple[int, ...]
) -> tuple[Tensor, Tensor]:
    """Tilt the layer's gate towards expert 0 by `skew` (uneven counts; past a
    capacity, drops) and draw inputs of `shape` (mean 1, so the tilt bites) and a
    target for one batch (`shape`'s last two dims): drawn on the host, so every
    device draws the same, then moved to the rank's device (the layer is not)."""
    with torch.no_grad():
        moe.gate.weight[0] += skew / shape[-1]
    dev = runtime.device()
    x = (torch.randn(shape) + 1.0).to(dev)
    return x, torch.randn(shape[-2:]).to(dev)


def layer_against_one_process(
    top_k: int = 1,
    capacity_factor: float = 1.25,
    *,
    tokens: int = 16,
    n_embd: int = 16,
    n_experts: int = 4,
    skew: float = 0.0,
    seed: int = 0,
    group: dist.ProcessGroup | None = None,
) -> dict:
    """One MoE layer over `group` (every rank `tokens` tokens) against one process
    routing the same groups. `skew` pushes tokens to expert 0 (uneven counts and,
    past its capacity, drops). The layer is split by this module's `shard_experts`,
    looked up when it runs (a negative control replaces it with a faulty one)."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(seed)
    moe = MoE(n_embd, n_experts, top_k, capacity_factor)
    x, target = skewed_inputs(moe, skew, (n * tokens, n_embd))  # (n T, C)
    moe.to(runtime.device())
    alone = as_reference(moe, n)
    shard_experts(moe, group)
    mine = slice(me * tokens, (me + 1) * tokens)
    x_mine = x[mine].clone().requires_grad_()  # as inside a model: the combine's
    x.requires_grad_()  # backward then runs the dispatch's too
    with Ledger() as ledger:
        out, loss = _layer_loss(moe, x_mine, target[mine])
        (loss / n).backward()
    t, kept = moe.traffic, moe.kept
    dist.all_reduce(moe.gate.weight.grad, group=group)
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    ref_out, ref_loss = _layer_loss(alone, x, target)
    ref_loss.backward()
    ref_kept = alone.kept.view(n, -1)[me]
    grads = [(moe.gate.weight.grad, alone.gate.weight.grad)]
    grads.append((x_mine.grad, x.grad[mine]))
    for i, e in enumerate(moe.experts):
        ref = alone.experts[moe.first + i]
        pairs = zip(e.parameters(), ref.parameters(), strict=True)
        grads += [(p.grad, q.grad) for p, q in pairs]
    expert, token = (t.tolist() for t in alone.routed)  # the whole batch's routing
    matrix = cost.dispatch_matrix(expert, token, tokens, n_experts // n, n)
    load, served = moe.load.clone(), moe.served.clone()
    dist.all_reduce(load, group=group)
    dist.all_reduce(served, group=group)
    return {
        "loss_diff": abs(total.item() / n - ref_loss.item()),
        "out_diff": (out - ref_out[mine]).abs().max().item(),
        "grad_diff": max((a - b).abs().max().item() for a, b in grads),
        "same_drops": bool(torch.equal(kept, ref_kept)),
        "dropped": int(alone.dropped),
        "load": load.tolist(),  # assignments per expert, all ranks, before drops
        "served": served.tolist(),  # and after them
        "room": n * capacity(tokens, n_experts, top_k, capacity_factor),
        "aux": alone.aux.item(),
        "bytes": ledger.bytes_sent(),
        "formula": cost.routed_bytes(matrix, me, n_experts, n_embd * 4),
        "sent": list(t.sent),
        "received": list(t.received),
    }


def _diff(named: dict[str, Tensor], ref: dict[str, Tensor], names: dict) -> float:
    return max((v - ref[names[k]]).abs().max().item() for k, v in named.items())


def model_against_one_process(
    mesh: Mesh,
    cfg: MoEConfig | None = None,
    *,
    steps: int = 3,
    batch: int = 8,
    lr: float = 0.5,
) -> dict:
    """Train a MoE TinyGPT dp x ep with SGD and alone; the gradient step is this
    module's `average_gradients`, looked up when it runs (a negative control
    replaces it). Every rank of the world calls it."""
    cfg = MoEConfig() if cfg is None else cfg
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = moe_gpt(cfg).to(runtime.device())
    alone = as_reference(model, world)
    parallelize(model, mesh)
    names = global_names(model)
    dev = runtime.device()
    batches = [(x.to(dev), y.to(dev)) for x, y in token_batches(steps, batch, cfg.gpt)]
    share = batch // world
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ref_opt = torch.optim.SGD(alone.parameters(), lr=lr)
    found: dict = {"losses": [], "ref_losses": []}
    for step, (x, y) in enumerate(batches):
        mine = slice(rank * share, (rank + 1) * share)
        opt.zero_grad()
        loss = moe_loss(model, x[mine], y[mine], cfg.aux_weight)
        loss.backward()
        average_gradients(model, mesh)
        ref_opt.zero_grad()
        ref_loss = moe_loss(alone, x, y, cfg.aux_weight)
        ref_loss.backward()
        if step == 0:
            grads = {k: p.grad for k, p in model.named_parameters()}
            ref = {k: p.grad for k, p in alone.named_parameters()}
            found["grad_diff"] = checks.max_over_ranks(_diff(grads, ref, names))
        total = loss.detach().clone()
        dist.all_reduce(total)
        found["losses"].append(total.item() / world)
        found["ref_losses"].append(ref_loss.item())
        opt.step()
        ref_opt.step()
    params = dict(model.named_parameters())
    ref = dict(alone.named_parameters())
    found["param_diff"] = checks.max_over_ranks(_diff(params, ref, names))
    pairs = zip(found["losses"], found["ref_losses"], strict=True)
    found["loss_diff"] = max(abs(a - b) for a, b in pairs)
    found["dropped"] = sum(m.dropped for _, m in moe_layers(model))  # last step
    found["experts_here"] = [
        [m.first + i for i in range(len(m.experts))] for _, m in moe_layers(model)
    ]
    return found


def lines(found: dict, what: str = "MoE") -> list[str]:
    """The verdict lines of a check's result (layer or model)."""
    keys = [k for k in ("out", "loss", "grad", "param") if f"{k}_diff" in found]
    said = {"out": "outputs", "loss": "loss", "grad": "gradients", "param": "params"}
    got = [
        f"{what} {said[k]} vs one process {checks.verdict(found[k + '_diff'], TOL)}"
        for k in keys
    ]
    if "same_drops" in found:
        got.append(
            f"{what} drops the same assignments as one process: {found['same_drops']}"
        )
    if "bytes" in found:
        got.append(
            f"{what} ledger bytes == formula: {found['bytes'] == found['formula']}"
        )
    return got

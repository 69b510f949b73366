"""The dropless layer against one process: the chapter's checks, as functions.

Every rank of the group calls `dropless_against_one_process`: one `DroplessMoE`
over the group and the same layer alone on the whole batch, for a few steps (the
balancing bias updated after each from the load), comparing outputs, the loss,
every gradient and the bias; the gate weights against the scores recomputed from
the gate (the bias must choose, never weigh); and the ledger's bytes against a
formula counted from the one process's routing of the whole batch, not from the
split sizes the dispatch sent. `dropless_lines` prints the verdicts.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import checks, runtime
from distcourse.comm.ledger import Ledger
from distcourse.parallel.experts import cost
from distcourse.parallel.experts.check import skewed_inputs
from distcourse.parallel.experts.dropless import DroplessMoE, shard_dropless

TOL = 1e-5  # float32 sums in another order differ by about 1e-7


def _loss(moe: DroplessMoE, x: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    y = moe(x)
    return y, ((y - target) ** 2).mean()


def _on_every_rank(ok: bool, group: dist.ProcessGroup | None) -> bool:
    """True where `ok` holds on every rank of the group (one all-reduce, MIN)."""
    flag = torch.tensor([int(ok)], device=runtime.device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _weights_are_scores(moe: DroplessMoE, x: Tensor) -> bool:
    """The weights the layer used equal the gate's scores of the chosen experts
    (renormalised over a token's k), recomputed here from the gate and x."""
    with torch.no_grad():
        logits = moe.gate(x)
        s = logits.sigmoid() if moe.score == "sigmoid" else logits.softmax(dim=-1)
        k = moe.top_k
        want = s[moe.token, moe.expert].view(k, -1)  # (k, T)
        if k > 1:
            want = want / want.sum(dim=0, keepdim=True)
        got = moe.weight.detach().view(k, -1)
    return bool((got - want).abs().max().item() <= TOL)


def dropless_against_one_process(
    top_k: int = 2,
    *,
    score: str = "sigmoid",
    n_shared: int = 1,
    balance_rate: float = 0.0,
    skew: float = 0.0,
    steps: int = 1,
    tokens: int = 16,
    n_embd: int = 16,
    n_experts: int = 8,
    seed: int = 0,
    group: dist.ProcessGroup | None = None,
) -> dict:
    """`steps` steps of one dropless layer over `group` (every rank `tokens`
    tokens) and alone on the whole batch; the last step compared. `skew` pushes
    tokens to expert 0. The layer is split by this module's `shard_dropless`,
    looked up when it runs (a negative control replaces it with a faulty one)."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    torch.manual_seed(seed)
    moe = DroplessMoE(
        n_embd,
        n_experts,
        top_k,
        n_shared=n_shared,
        score=score,
        balance_rate=balance_rate,
    )
    xs, target = skewed_inputs(moe, skew, (steps, n * tokens, n_embd))
    moe.to(runtime.device())
    alone = copy.deepcopy(moe)
    shard_dropless(moe, group)
    mine = slice(me * tokens, (me + 1) * tokens)
    for step in range(steps):
        moe.zero_grad(set_to_none=True)
        alone.zero_grad(set_to_none=True)
        x_mine = xs[step][mine].clone().requires_grad_()
        x = xs[step].clone().requires_grad_()
        with Ledger() as ledger:
            out, loss = _loss(moe, x_mine, target[mine])
            (loss / n).backward()
        ref_out, ref_loss = _loss(alone, x, target)
        ref_loss.backward()
        weights_ok = _weights_are_scores(moe, x_mine)
        moe.balance()
        alone.balance()
    stacked = ("w1", "w2", "w3")
    replicated = [(k, p) for k, p in moe.named_parameters() if k not in stacked]
    ref = dict(alone.named_parameters())
    grads = [(x_mine.grad, x.grad[mine])]
    for k, p in replicated:
        dist.all_reduce(p.grad, group=group)
        grads.append((p.grad, ref[k].grad))
    here = slice(moe.first, moe.first + moe.w1.shape[0])
    grads += [(getattr(moe, k).grad, ref[k].grad[here]) for k in stacked]
    total = loss.detach().clone()
    dist.all_reduce(total, group=group)
    matrix = cost.dispatch_matrix(
        alone.expert.tolist(), alone.token.tolist(), tokens, moe.w1.shape[0], n
    )
    worst = functools.partial(checks.max_over_ranks, group=group)  # group's verdict
    return {
        "out_diff": worst((out - ref_out[mine]).abs().max().item()),
        "loss_diff": abs(total.item() / n - ref_loss.item()),
        "grad_diff": worst(max((a - b).abs().max().item() for a, b in grads)),
        "bias_diff": worst((moe.bias - alone.bias).abs().max().item()),
        "bias": alone.bias.tolist(),
        "weights_ok": _on_every_rank(weights_ok, group),
        "balanced": balance_rate > 0 and steps > 1,
        "load": alone.load.tolist(),  # assignments per expert, whole batch
        "assignments": top_k * n * tokens,
        "bytes": ledger.bytes_sent(),
        "formula": cost.routed_bytes(matrix, me, n_experts, n_embd * 4),
        "matrix": matrix,
    }


def dropless_lines(found: dict, what: str = "dropless MoE") -> list[str]:
    """The verdict lines of `dropless_against_one_process`'s result."""
    said = {"out": "outputs", "loss": "loss", "grad": "gradients"}
    if found["balanced"]:
        said["bias"] = "balancing bias"
    got = [
        f"{what} {v} vs one process {checks.verdict(found[k + '_diff'], TOL)}"
        for k, v in said.items()
    ]
    if found["balanced"]:
        ok = found["weights_ok"]
        got.append(f"{what} weights are the scores, not the bias: {ok}")
    same = found["bytes"] == found["formula"]
    got.append(f"{what} ledger bytes == routed rows (global batch): {same}")
    return got

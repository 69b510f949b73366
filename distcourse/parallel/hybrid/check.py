"""One layout against one process: the chapter's equivalence check, as a function.

Every rank of the world calls `against_one_process`: it builds the layout's mesh,
trains the hybrid model for a few steps, then trains the one-process model on the
same batches and compares the first step's gradients (gathered), the losses of
every step and the final (gathered) parameters, and the bytes each axis sent in
the last step (ledger) with the formula.

Why gradients, and plain SGD by default: AdamW's step is m / (sqrt(v) + eps), which
a constant factor on every gradient leaves unchanged (m and sqrt(v) both scale by
it). Summing over the dp replicas instead of averaging, or dropping the 1/m of the
micro-batches, doubles every gradient and AdamW still trains exactly as one
process: a check of losses and parameters after AdamW cannot see it. The gradients
themselves, and SGD's step lr * g, can.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import checks
from distcourse.examples.gpt import GPTConfig, TinyGPT, lm_loss, token_batches
from distcourse.parallel.hybrid.cost import bytes_per_step
from distcourse.parallel.hybrid.layout import Layout, make_mesh
from distcourse.parallel.hybrid.runner import OPTIMIZERS, HybridGPT

# A key's bias adds the same number to every score of a query: softmax ignores it,
# so its true gradient is 0 and both runs hold rounding noise there (about 1e-9).
# AdamW's first step is lr * g / (|g| + eps), about lr * sign(g) once |g| is well
# above eps = 1e-8: noise of opposite signs in the two runs moves the parameter
# apart by up to 2 lr. Under AdamW it is left out of the parameter comparison.
SKIP = "key.bias"
LR = {"sgd": 0.5, "adamw": 1e-2}  # SGD's step lr * g needs a larger lr to learn
# float32 sums in another order differ by about 1e-7 (measured: gradients 4e-8,
# losses 5e-7, SGD's parameters 1e-7); AdamW's parameters 2e-5, from SKIP-like
# parameters whose gradients are small and noisy. A x2 gradient moves all of them
# by the order of their values.
TOL = {"gradients": 1e-5, "losses": 1e-5, "sgd": 1e-5, "adamw": 1e-4}


def train_alone(
    model: TinyGPT, batches: list[tuple[Tensor, Tensor]], optimizer: str, lr: float
) -> tuple[list[float], dict[str, Tensor]]:
    """One process: a step per batch; the losses and the first step's gradients."""
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=lr)
    losses: list[float] = []
    first: dict[str, Tensor] = {}
    for x, y in batches:
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        if not first:
            first = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, first


def _worst(mine: dict[str, Tensor], want: dict[str, Tensor], skip: str | None) -> float:
    """Largest |mine - want| over the keys this rank holds (host tensors)."""
    return max(
        (mine[k].cpu() - want[k]).abs().max().item()
        for k in mine
        if skip is None or not k.endswith(skip)
    )


def against_one_process(
    layout: Layout,
    cfg: GPTConfig,
    *,
    steps: int = 6,
    batch: int = 8,
    micro_batches: int = 1,
    seed: int = 0,
    optimizer: str = "sgd",
    runner: type[HybridGPT] = HybridGPT,
) -> dict:
    """On every rank: train `layout` and one process alike, with `optimizer`
    ("sgd" or "adamw", at LR's rate); a dict of coordinate, losses (hybrid and
    alone), grad_diff (the first step's gradients), loss_diff, param_diff (each
    the max over all ranks), covered (every parameter is held by some rank),
    bytes (ledger, last step), formula (cost.bytes_per_step), memory and the
    devices the stage's parameters are on.
    `runner` is HybridGPT or a subclass that plants a fault (negative controls)."""
    if optimizer not in LR:
        raise ValueError(f"optimizer={optimizer!r}: use one of {list(LR)}")
    mesh = make_mesh(layout, cfg)
    torch.manual_seed(seed)
    model = TinyGPT(cfg)
    lr = LR[optimizer]
    net = runner(model, mesh, micro_batches=micro_batches, optimizer=optimizer, lr=lr)
    batches = token_batches(steps, batch, cfg, seed=seed)
    losses, grads = [], {}
    for i, (x, y) in enumerate(batches):
        losses.append(net.step(x, y, ledger=i == steps - 1))
        if i == 0:
            grads = net.one_process_grads()  # my stage, tp slices gathered
    mine = net.one_process_state()
    net.close()
    alone, first = train_alone(model, batches, optimizer, lr)
    want = model.state_dict()
    skip = SKIP if optimizer == "adamw" else None
    keys: list = [None] * dist.get_world_size()
    dist.all_gather_object(keys, sorted(mine))
    return dict(
        coordinate=mesh.coordinate,
        optimizer=optimizer,
        losses=losses,
        alone=alone,
        grad_diff=checks.max_over_ranks(_worst(grads, first, None)),
        loss_diff=max(abs(a - b) for a, b in zip(losses, alone, strict=True)),
        param_diff=checks.max_over_ranks(_worst(mine, want, skip)),
        covered=set().union(*keys) == set(want),
        held=sum(p.numel() for p in net.module.parameters()),
        device={str(p.device) for p in net.module.parameters()},
        bytes=net.bytes,
        formula=bytes_per_step(layout, cfg, batch, net.stage),
        memory=net.held(),
    )


def verdicts(found: dict) -> list[str]:
    """The lines a chapter prints for one rank's `against_one_process` result, each
    ending in a verdict against TOL (the negative controls read the same lines)."""
    opt, steps = found["optimizer"], len(found["losses"])
    return [
        f"gradients of step 1 vs one process "
        f"{checks.verdict(found['grad_diff'], TOL['gradients'])}",
        f"losses of {steps} {opt} steps vs one process "
        f"{checks.verdict(found['loss_diff'], TOL['losses'])}",
        f"parameters after {steps} {opt} steps vs one process "
        f"{checks.verdict(found['param_diff'], TOL[opt])}",
        f"every parameter on some rank: {found['covered']}",
    ]


def bytes_line(found: dict) -> str:
    """What a rank sent per axis in the last step (ledger, wire bytes) and whether
    it equals `cost.bytes_per_step`, as a chapter prints it."""
    sent = ", ".join(f"{axis} {n:,}" for axis, n in found["bytes"].items())
    return f"{sent}; ledger == formula: {found['bytes'] == found['formula']}"

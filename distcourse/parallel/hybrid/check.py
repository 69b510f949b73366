"""One layout against one process: the chapter's equivalence check, as a function.

Every rank of the world calls `against_one_process`: it builds the layout's mesh,
trains the hybrid model for a few steps, then trains the one-process model on the
same batches and compares losses and (gathered) parameters, and the bytes each axis
sent in the last step (ledger) with the formula.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distcourse import checks
from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches, train_lm
from distcourse.parallel.hybrid.cost import bytes_per_step
from distcourse.parallel.hybrid.layout import Layout, make_mesh
from distcourse.parallel.hybrid.runner import HybridGPT

# a key's bias adds the same number to every score of a query: softmax ignores it,
# so its true gradient is 0 and both runs hold rounding noise there, which AdamW
# divides by its own square root (chapter 4): it is left out of the comparison
SKIP = "key.bias"


def against_one_process(
    layout: Layout,
    cfg: GPTConfig,
    *,
    steps: int = 6,
    batch: int = 8,
    micro_batches: int = 1,
    seed: int = 0,
) -> dict:
    """On every rank: train `layout` and one process alike; a dict of
    coordinate, losses (hybrid and alone), loss_diff, param_diff (max over all
    ranks), covered (every parameter is held by some rank), bytes (ledger, last
    step) and formula (cost.bytes_per_step)."""
    mesh = make_mesh(layout, cfg)
    torch.manual_seed(seed)
    model = TinyGPT(cfg)
    net = HybridGPT(model, mesh, micro_batches=micro_batches)
    batches = token_batches(steps, batch, cfg, seed=seed)
    losses = [net.step(x, y, ledger=i == steps - 1) for i, (x, y) in enumerate(batches)]
    mine = net.one_process_state()  # my stage, tp slices gathered
    net.close()
    alone = train_lm(model, batches)
    want = model.state_dict()
    diff = max(
        (mine[k].cpu() - want[k]).abs().max().item()
        for k in mine
        if not k.endswith(SKIP)
    )
    keys: list = [None] * dist.get_world_size()
    dist.all_gather_object(keys, sorted(mine))
    return dict(
        coordinate=mesh.coordinate,
        losses=losses,
        alone=alone,
        loss_diff=max(abs(a - b) for a, b in zip(losses, alone, strict=True)),
        param_diff=checks.max_over_ranks(diff),
        covered=set().union(*keys) == set(want),
        held=sum(p.numel() for p in net.module.parameters()),
        bytes=net.bytes,
        formula=bytes_per_step(layout, cfg, batch, net.stage),
        memory=net.held(),
    )

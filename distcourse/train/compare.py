"""`--compare`: the trainer's steps against one process training the same steps.

One process builds the same model (`model.one_process`: the same names draw the
same numbers), the same optimizer, schedule and clipping, on the same device
type, and trains on the same batches (the sampler's rows of every rank at once).
Compared, with nothing gathered: every tensor a rank holds against the same part
of one process's (`placement.Box`): step 1's gradients (those the optimizer
steps, after the data-parallel reduce) and the parameters after the last step;
and every step's loss. Run it with SGD first: AdamW's step hides a constant
factor on every gradient (chapter 8's `hybrid.check` says why), SGD's does not;
then with AdamW, the optimizer a run trains with.

float32 (TOL["float32"]): sums in another order differ by about 1e-7; chapter 8
measured gradients 4e-8 and losses 5e-7 over layouts of 8 ranks. A gradient
summed instead of averaged over dp is off by its own size (1e-2 and more).
The largest difference is compared (TF32 is off for it on a GPU: its 10-bit
mantissa would make float32 a bf16 comparison).

bfloat16 (TOL["bfloat16"]): one process and the layout round differently (each
rank's matmuls see other rows; TP sums bf16 partial outputs), so no difference is
zero. The gradients are judged by what bf16 costs: their relative difference
from one process in float32 (sqrt of the summed squared differences over sqrt of
the summed squares, over the whole model, every element counted once), as a
multiple of one process in bf16's own (`grad_ratio`): a layout that loses no
more precision than one bf16 process is at or below 1. Losses and the
parameters after SGD's steps are compared with one process in bf16 (absolute
and relative differences). Measured on every layout of 8 and 4 ranks
(`tests/test_train_compare.py`, chapter 13): see TOL's comment. Gradients reduced
over dp in bf16 where fp32 is asked add their own rounding and fail it
(`tests/controls/test_13_trainer.py`).
"""

from __future__ import annotations

import functools
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import checks, runtime
from distcourse.examples.gpt import lm_loss
from distcourse.mesh import Mesh
from distcourse.parallel.hybrid import make_mesh
from distcourse.parallel.hybrid.runner import OPTIMIZERS
from distcourse.train import model as model_mod
from distcourse.train.layout import TrainLayout
from distcourse.train.sampler import Sampler
from distcourse.train.state import optimizer_options
from distcourse.train.trainer import RunConfig, Trainer, lr_factor

# bf16 (see the module docstring): step 1's gradients' error against float32 as a
# multiple of one bf16 process's, measured under autocast: 0.76 to 0.92 over
# every layout of 8 ranks (tests/test_train_compare.py's model), 0.77 to 0.82 on
# chapter 13's 4, 1 at world 1 (the same computation); bound 1.05. Gradients
# reduced over dp in bf16: 1.18 to 1.27 on 4 ranks. FSDP computes in its bf16
# parameters (MixedPrecisionPolicy: the norms and the residual stream in bf16 too,
# beyond autocast): 1.02 to 1.22 over the models and worlds tested; bound 1.5.
# Losses at most 2e-5 (8 ranks) to 8.5e-4 (4 ranks, 2 steps) from one bf16 process;
# parameters after an SGD step 2e-4 apart (relative).
TOL = {
    "float32": {"losses": 1e-5, "gradients": 1e-5, "parameters": 1e-5},
    "bfloat16": {"losses": 2e-3, "gradients": 1.05, "parameters": 1e-3},
    "bfloat16 fsdp": {"losses": 2e-3, "gradients": 1.5, "parameters": 1e-3},
}


def tolerance(layout: TrainLayout) -> dict[str, float]:
    """TOL's row for the layout's dtype (and FSDP's own bf16 policy)."""
    if layout.dtype == "bfloat16" and layout.data_mode == "fsdp":
        return TOL["bfloat16 fsdp"]
    return TOL[layout.dtype]


@functools.lru_cache(maxsize=8)
def one_process(
    run: RunConfig, corpus: object, steps: int, dtype: torch.dtype
) -> tuple[list[float], dict[str, Tensor], dict[str, Tensor]]:
    """One process on this rank's device: each step's loss, step 1's gradients
    (clipped, as the optimizer steps them), the parameters after `steps` steps
    (host tensors under TinyGPT's names). Kept for the next layout compared
    with the same run (the caller must not change them)."""
    device = runtime.device()
    cfg = run.model(corpus)
    model = model_mod.one_process(cfg, run.seed, device)
    options = optimizer_options(run.optimizer, device)
    opt = OPTIMIZERS[run.optimizer](model.parameters(), lr=run.lr, **options)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(run))
    sampler = Sampler(corpus.train, run.batch, cfg.block_size, seed=run.seed)  # type: ignore[attr-defined]
    amp = dtype != torch.float32
    losses: list[float] = []
    first: dict[str, Tensor] = {}
    for _ in range(steps):
        x, y = (t.to(device) for t in next(sampler))
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype) if amp else nullcontext():
            logits = model(x)
        loss = lm_loss(logits.float(), y)
        loss.backward()
        if run.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), run.clip)
        if not first:  # what the optimizer steps: clipped
            first = {
                k: p.grad.detach().cpu().clone() for k, p in model.named_parameters()
            }
        opt.step()
        scheduler.step()
        losses.append(loss.item())
    final = {k: p.detach().cpu().clone() for k, p in model.named_parameters()}
    return losses, first, final


def differences(local: list, reference: dict[str, Tensor]) -> tuple[float, float]:
    """(largest |difference|, relative L2 difference) of this rank's boxed
    tensors against the reference, over the world: every box counted once
    however many ranks hold it (a collective)."""
    mine: dict[str, tuple[float, float, float]] = {}
    for box, t in local:
        diff = t.detach().float().cpu() - box.of(reference[box.name]).float()
        ref = box.of(reference[box.name]).double()
        name = f"{box.name}@{box.offsets}:{box.sizes}"
        mine[name] = (
            diff.abs().max().item(),
            diff.double().square().sum().item(),
            ref.square().sum().item(),
        )
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    union: dict = {}
    for found in every:
        union.update(found)
    worst = max((v[0] for v in union.values()), default=0.0)
    diff2, ref2 = sum(v[1] for v in union.values()), sum(v[2] for v in union.values())
    return worst, (diff2 / ref2) ** 0.5 if ref2 > 0 else 0.0


def relative(tensors: dict[str, Tensor], reference: dict[str, Tensor]) -> float:
    """The relative L2 difference of two one-process state dicts (one process)."""
    diff2 = sum(
        (tensors[k].double() - v.double()).square().sum() for k, v in reference.items()
    )
    ref2 = sum(v.double().square().sum() for v in reference.values())
    return float((diff2 / ref2) ** 0.5)


def against_one_process(
    layout: TrainLayout,
    run: RunConfig,
    corpus: object,
    steps: int | None = None,
    mesh: Mesh | None = None,
) -> dict:
    """On every rank: `steps` (default run.steps) of the trainer and of one
    process; a dict of losses, alone (one process's), loss_diff (their largest
    difference), grad_diff and grad_rel (step 1's gradients: largest and
    relative difference, over the world), param_diff and param_rel (after the
    last step), the dtype and its tolerances. `mesh`: the layout's, if built
    already (a mesh costs a process group per axis and coordinate)."""
    steps = run.steps if steps is None else steps
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 compared as float32
    try:
        trainer = Trainer(layout, run, corpus, resume=False, mesh=mesh)
        grads: list = []
        try:
            for step in range(steps):
                trainer.step()
                if step == 0:
                    grads = [
                        (b, t.detach().clone()) for b, t in trainer.net.local("grad")
                    ]
            params = trainer.net.local("param")
            alone, first, final = one_process(run, corpus, steps, layout.torch_dtype)
            grad_diff, grad_rel = differences(grads, first)
            param_diff, param_rel = differences(params, final)
            grad_ratio = None
            if layout.dtype != "float32":  # what bf16 costs, against float32
                truth = one_process(run, corpus, 1, torch.float32)[1]
                grad_ratio = differences(grads, truth)[1] / relative(first, truth)
        finally:
            trainer.close()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    diffs = [abs(a - b) for a, b in zip(trainer.losses, alone, strict=True)]
    return dict(
        layout=layout.name,
        optimizer=run.optimizer,
        dtype=layout.dtype,
        tol=tolerance(layout),
        losses=trainer.losses,
        alone=alone,
        loss_diff=max(diffs),
        grad_diff=grad_diff,
        grad_rel=grad_rel,
        grad_ratio=grad_ratio,
        param_diff=param_diff,
        param_rel=param_rel,
    )


def against_each(
    layouts: list[TrainLayout], run: RunConfig, corpus: object
) -> list[dict]:
    """`against_one_process` for each layout (a collective), one mesh per grid
    built once and shared by the compositions on it."""
    meshes: dict = {}
    found = []
    for layout in layouts:
        if layout.grid not in meshes:
            cfg = run.model(corpus)
            meshes[layout.grid] = make_mesh(layout.grid, cfg, timeout=run.timeout)
        found.append(against_one_process(layout, run, corpus, mesh=meshes[layout.grid]))
    return found


def ratio_verdict(ratio: float, bound: float) -> str:
    """checks.verdict for a ratio near 1, to 2 decimals: '<= 1.05: PASS', or
    '= 1.27 > 1.05: FAIL'."""
    if ratio <= bound:
        return f"<= {bound:.2f}: PASS"
    return f"= {ratio:.2f} > {bound:.2f}: FAIL"


def verdicts(found: dict) -> list[str]:
    """The lines `--compare` prints, each ending in a verdict against TOL: the
    largest differences in float32, relative ones for the tensors in bf16."""
    steps, opt, tol = len(found["losses"]), found["optimizer"], found["tol"]
    rel = found["dtype"] != "float32"
    param = found["param_rel"] if rel else found["param_diff"]
    how = "relative " if rel else ""
    grads = (
        "difference from one process in float32, x one bf16 process's "
        f"{ratio_verdict(found['grad_ratio'], tol['gradients'])}"
        if rel
        else f"difference {checks.verdict(found['grad_diff'], tol['gradients'])}"
    )
    lines = [
        f"{found['layout']}: gradients of step 1 vs one process, {grads}",
        f"{found['layout']}: losses of {steps} {opt} steps vs one process "
        f"{checks.verdict(found['loss_diff'], tol['losses'])}",
    ]
    if opt == "sgd":  # AdamW's g / sqrt(v) turns a zero gradient's noise into steps
        lines.append(
            f"{found['layout']}: parameters after {steps} {opt} steps vs one process, "
            f"{how}difference {checks.verdict(param, tol['parameters'])}"
        )
    return lines

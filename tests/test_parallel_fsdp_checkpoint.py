"""Checkpoints that reshard: saved by FSDP on 4 ranks, resumed on 2 and on 1.

Both libraries save with `torch.distributed.checkpoint` (DCP): torch's `fully_shard`
through `get_state_dict`, ours through `fsdp.checkpoint` (each piece a Shard(0)
DTensor). Each checkpoint is loaded by each library on 2 ranks and on 1 and trained
on; after 4 steps the parameters equal those of the run that never stopped (one
process on all 4 ranks' rows at every step), with SGD and with AdamW and its
optimizer state. A resumed world of w ranks keeps the global batch: rank r trains on
the rows ranks 4r/w .. 4(r+1)/w - 1 had.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard as torch_fully_shard

from distcourse import runtime
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.parallel.fsdp import (
    full_state_dict,
    fully_shard,
    load_model_state,
    load_optimizer_state,
    model_state,
    optimizer_state,
    world_mesh,
)

ATOL = 1e-5
SAVED_ON, STOP, STEPS = 4, 2, 4
LIBRARIES = ("ours", "torch")


def _make(library: str, kind: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = ex.uneven_mlp()
    shard = fully_shard if library == "ours" else torch_fully_shard
    mesh = world_mesh()  # torch's default mesh would be the GPU, if one is seen
    for layer in model:
        if isinstance(layer, nn.Linear):
            shard(layer, mesh=mesh)
    shard(model, mesh=mesh)
    return model, ex.optimizer(kind, model.parameters())


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    """Steps of the 4-rank run's global batch, split over this world."""
    info = runtime.require_initialized()
    per = SAVED_ON // info.world_size
    for step in steps:
        rows = [
            ex.batch(step, q) for q in range(info.rank * per, (info.rank + 1) * per)
        ]
        x, y = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def _state(library: str, model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    if library == "ours":
        return {"model": model_state(model), "optim": optimizer_state(model, opt)}
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _load(
    library: str,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    state: dict,
    optim: bool = True,
) -> None:
    if library == "ours":
        load_model_state(model, state["model"])
        if optim:
            load_optimizer_state(model, opt, state["optim"])
    else:
        set_state_dict(
            model,
            opt,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"] if optim else {},
        )


def _full(library: str, model: nn.Module) -> dict[str, torch.Tensor]:
    if library == "ours":
        return full_state_dict(model)
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def _save(root: str) -> dict:
    """On 4 ranks: each library trains 2 steps and saves; then trains on."""
    out = {}
    for kind in ex.OPTIMIZERS:
        reference = ex.one_process(SAVED_ON, kind, steps=STEPS)
        for library in LIBRARIES:
            model, opt = _make(library, kind)
            _train(model, opt, range(STOP))
            dcp.save(
                _state(library, model, opt), checkpoint_id=f"{root}/{library}-{kind}"
            )
            _train(model, opt, range(STOP, STEPS))
            out[kind, library] = ex.max_difference(_full(library, model), reference)
    return out


def _resume(root: str) -> dict:
    """On this world: every checkpoint loaded by each library, trained to step 4."""
    out = {}
    for kind in ex.OPTIMIZERS:
        reference = ex.one_process(SAVED_ON, kind, steps=STEPS)
        for saver in LIBRARIES:
            for loader in LIBRARIES:
                model, opt = _make(loader, kind)
                state = _state(loader, model, opt)
                dcp.load(state, checkpoint_id=f"{root}/{saver}-{kind}")
                _load(loader, model, opt, state)
                _train(model, opt, range(STOP, STEPS))
                got = ex.max_difference(_full(loader, model), reference)
                out[kind, saver, loader] = got
    # planted fault: AdamW resumed with its parameters but a fresh optimizer state
    model, opt = _make("ours", "AdamW")
    state = _state("ours", model, opt)
    dcp.load(state, checkpoint_id=f"{root}/ours-AdamW")
    _load("ours", model, opt, state, optim=False)
    for group in opt.param_groups:  # as if never stepped
        for p in group["params"]:
            opt.state[p] = {}
    _train(model, opt, range(STOP, STEPS))
    reference = ex.one_process(SAVED_ON, "AdamW", steps=STEPS)
    out["fresh AdamW state"] = ex.max_difference(_full("ours", model), reference)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = str(tmp_path_factory.mktemp("dcp"))
    saved = spawn(_save, SAVED_ON, root, timeout=60)
    return {SAVED_ON: saved, **{w: spawn(_resume, w, root, timeout=60) for w in (2, 1)}}


def test_the_run_that_never_stopped_is_one_process(runs: dict) -> None:
    for rank_result in runs[SAVED_ON]:
        assert max(rank_result.values()) <= ATOL, rank_result


@pytest.mark.parametrize("world", [2, 1])
def test_each_checkpoint_resumes_in_each_library(runs: dict, world: int) -> None:
    for rank_result in runs[world]:
        resumed = {k: v for k, v in rank_result.items() if isinstance(k, tuple)}
        assert len(resumed) == 2 * 2 * 2
        assert max(resumed.values()) <= ATOL, resumed


@pytest.mark.parametrize("world", [2, 1])
def test_a_fresh_optimizer_state_fails(runs: dict, world: int) -> None:
    for rank_result in runs[world]:
        assert rank_result["fresh AdamW state"] > 100 * ATOL

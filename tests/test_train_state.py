"""The composed model on this rank (`state.build`): its own stage, drawn by name,
checkpointed blocks, AdamW fused where torch has the kernel."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from distcourse.examples.gpt import GPTConfig
from distcourse.launch import spawn
from distcourse.parallel.checkpointing import Checkpointed
from distcourse.parallel.hybrid import make_mesh
from distcourse.train import model as model_mod
from distcourse.train import state
from distcourse.train.layout import TrainLayout

CFG = GPTConfig(vocab=16, block_size=8, n_layer=2, n_head=4, n_embd=16)


def test_adamw_is_fused_where_torch_has_the_kernel() -> None:
    assert state.optimizer_options("adamw", torch.device("cpu")) == {"fused": True}
    assert state.optimizer_options("adamw", torch.device("cuda", 0)) == {"fused": True}
    emulated = SimpleNamespace(type="gpu")  # an emulated GPU: no fused kernel
    assert state.optimizer_options("adamw", emulated) == {}  # type: ignore[arg-type]
    assert state.optimizer_options("sgd", torch.device("cpu")) == {}


def _built() -> dict:
    layout = TrainLayout(dp=1, pp=2, micro_batches=2, ckpt="full")
    net = state.build(
        layout, CFG, make_mesh(layout.grid, CFG), optimizer="adamw", lr=0.1, seed=0
    )
    whole = model_mod.one_process(CFG, 0).state_dict()
    found = dict(
        wrapped=sum(isinstance(m, Checkpointed) for m in net.module),
        fused=net.optimizer.param_groups[0]["fused"],
        exact=all(torch.equal(t, b.of(whole[b.name])) for b, t in net.local("param")),
        names=sorted(b.name for b, _ in net.local("param")),
    )
    net.close()
    return found


def test_each_rank_builds_its_checkpointed_stage_as_one_process_draws_it() -> None:
    found = spawn(_built, 2, timeout=60)
    assert (
        found[0]["names"][0] == "blocks.0.attn.key.bias"
        and "tok.weight" in found[0]["names"]
    )
    assert "head.weight" in found[1]["names"] and "tok.weight" not in found[1]["names"]
    for f in found:
        assert f["wrapped"] == 1 and f["fused"] and f["exact"], f

"""The composed model and its one-process form on real gloo ranks: `gather` gives
the whole model (pipeline stages and TP slices, checkpointed blocks too), and
`scatter` cuts it back into exactly this rank's parameters."""

from __future__ import annotations

import torch

from distcourse.examples.gpt import GPTConfig, TinyGPT
from distcourse.launch import spawn
from distcourse.parallel.checkpointing import Checkpointed
from distcourse.parallel.hybrid import make_mesh
from distcourse.train import state
from distcourse.train.layout import TrainLayout

CFG = GPTConfig(vocab=16, block_size=8, n_layer=2, n_head=4, n_embd=16)


def _round_trip() -> dict:
    layout = TrainLayout(dp=1, pp=2, tp=2, micro_batches=2, ckpt="full")
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    net = state.build(
        layout, model, make_mesh(layout.grid, CFG), optimizer="sgd", lr=0.1
    )
    whole = state.gather(net)
    mine = [p.detach().clone() for p in net.module.parameters()]
    doubled = state.gather(net, [2 * p.detach() for p in net.module.parameters()])
    cut = state.scatter(net, model.state_dict())
    net.close()
    want = model.state_dict()
    return dict(
        wrapped=sum(isinstance(m, Checkpointed) for m in net.module),
        exact=all(torch.equal(v, want[k]) for k, v in whole.items()),
        keys=sorted(whole),
        doubled=all(torch.equal(v, 2 * want[k]) for k, v in doubled.items()),
        restored=all(
            torch.equal(a, b)
            for a, b in zip(mine, net.module.parameters(), strict=True)
        ),
        cut=all(torch.equal(a, b) for a, b in zip(cut, mine, strict=True)),
    )


def test_gather_and_scatter_are_exact_inverses_on_a_1x2x2_layout() -> None:
    found = spawn(_round_trip, 4, timeout=60)
    stage_keys = [set(f["keys"]) for f in found]
    assert set().union(*stage_keys) == set(TinyGPT(CFG).state_dict())
    for f in found:
        assert f["wrapped"] == 1  # one block per stage, checkpointed
        assert f["exact"] and f["doubled"] and f["restored"] and f["cut"], f

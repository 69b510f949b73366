"""HybridGPT's construction and step on real ranks, beyond chapter 8's checks
(tests/test_parallel_hybrid.py): a pipeline rank holds only its stages (its
parameter bytes counted, the other stages on meta), a model on the meta device is
drawn by name equal to one process's, a TP step after the first makes no host
sync (counted on emulated GPU ranks), and each tensor's Box is its part of the
one-process tensor."""

from __future__ import annotations

import torch

from distcourse import emulate, runtime
from distcourse.examples.gpt import GPTConfig
from distcourse.launch import spawn
from distcourse.parallel import hybrid
from distcourse.parallel.hybrid.placement import Box
from distcourse.train import model as model_mod

CFG = GPTConfig(vocab=64, block_size=16, n_layer=4, n_head=4, n_embd=32)
INIT = model_mod.init_weights(0, CFG.n_layer)


def _bytes_held(layout: hybrid.Layout, meta: bool) -> dict:
    mesh = hybrid.make_mesh(layout, CFG)
    model = model_mod.on_meta(CFG) if meta else model_mod.one_process(CFG, 0)
    net = hybrid.HybridGPT(model, mesh, micro_batches=layout.pp, init=INIT)
    real = [p for p in net.module.parameters() if not p.is_meta]
    twins = [p for t in net.twins for p in t.parameters()]
    whole = model_mod.one_process(CFG, 0).state_dict()
    exact = all(
        torch.equal(t.cpu(), b.of(whole[b.name])) for b, t in net.local("param")
    )
    net.close()
    return dict(
        mine=sum(p.numel() * p.element_size() for p in real),
        formula=4 * hybrid.parameters_held(layout, CFG, net.stage),
        all_real=len(real) == len(list(net.module.parameters())),
        twins_meta=all(p.is_meta for p in twins),
        exact=exact,
    )


def test_a_pipeline_rank_holds_only_its_stages() -> None:
    whole = 4 * sum(p.numel() for p in model_mod.on_meta(CFG).parameters())
    for meta in (True, False):  # drawn by name, or copied from a host model
        found = spawn(_bytes_held, 4, hybrid.Layout(pp=4), meta, timeout=60)
        for rank, f in enumerate(found):
            assert f["mine"] == f["formula"], (rank, f)
            assert f["all_real"] and f["twins_meta"] and f["exact"], (rank, f)
        held = [f["mine"] for f in found]
        assert sum(held) == whole and max(held) < whole / 2, held


def _syncs_per_step() -> list[int]:
    layout = hybrid.Layout(tp=2)
    net = hybrid.HybridGPT(
        model_mod.on_meta(CFG), hybrid.make_mesh(layout, CFG), init=INIT, meter=False
    )
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, CFG.vocab, (4, CFG.block_size), generator=gen)
    device = runtime.device()
    counts = []
    for _ in range(3):
        emulate.reset_host_syncs()
        net.forward_backward(x.to(device), x.to(device))  # forward and backward
        counts.append(emulate.host_syncs())
    net.close()
    return counts


def test_a_tp_step_after_the_first_makes_no_host_sync() -> None:
    found = spawn(_syncs_per_step, 2, backend="emulated", timeout=60)
    for counts in found:
        first, *later = counts
        assert first > 0  # the first agrees on shapes: an all_gather read back
        assert later == [0, 0], counts


def _checked_every_step() -> list[int]:
    net = hybrid.HybridGPT(
        model_mod.on_meta(CFG), hybrid.make_mesh(hybrid.Layout(tp=2), CFG), init=INIT
    )
    x = torch.zeros(4, CFG.block_size, dtype=torch.long).to(runtime.device())
    net.check = True
    counts = []
    for shape in (4, 4, 2):  # a new shape: agreed again
        emulate.reset_host_syncs()
        net.forward_backward(x[:shape], x[:shape])
        counts.append(emulate.host_syncs())
    net.close()
    return counts


def test_a_new_shape_is_agreed_again() -> None:
    for counts in spawn(_checked_every_step, 2, backend="emulated", timeout=60):
        assert counts[0] > 0 and counts[1] == 0 and counts[2] == counts[0], counts


def test_a_box_is_its_part_of_the_whole_tensor() -> None:
    whole = torch.arange(2 * 6.0).view(2, 6)
    box = Box.whole("w", (2, 6)).split(1, 1, 3)  # columns 2, 3 of 6
    assert box.of(whole).tolist() == [[2.0, 3.0], [8.0, 9.0]]
    assert box.rows(1, 1).of(whole).tolist() == [[8.0, 9.0]]
    part = box.of(whole).reshape(-1)
    runs = box.runs(1, 4)  # elements 1..3 of the part, row-major: 3 | 8, 9
    assert [r.of(whole).reshape(-1).tolist() for r in runs] == [[3.0], [8.0, 9.0]]
    assert torch.cat([r.of(whole).reshape(-1) for r in runs]).tolist() == (
        part[1:4].tolist()
    )
    mine, theirs = box.overlap(Box("w", (2, 6), (1, 3), (1, 3)))
    assert box.of(whole)[mine].tolist() == [[9.0]]
    assert Box("w", (2, 6), (1, 3), (1, 3)).of(whole)[theirs].tolist() == [[9.0]]
    assert box.overlap(Box("w", (2, 6), (0, 4), (2, 2))) is None

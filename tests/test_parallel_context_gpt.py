"""TinyGPT with ring attention trained dp x cp on 4 gloo ranks (a 2 x 2 mesh),
zig-zag and contiguous: the first step's gradients and the parameters after 3 SGD
steps equal one process's (1e-5), also on the mesh of chapter 8's `Layout(dp=2,
cp=2)`; a step's wire bytes equal `step_bytes`; a cp that does not divide the
world and a sequence that does not split are refused before any collective."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from spawned import on_ranks

from distcourse import runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches
from distcourse.parallel import hybrid
from distcourse.parallel.context import gpt as cg


def _run() -> dict[str, object]:
    torch.set_num_threads(1)
    cfg, out = GPTConfig(), {}
    batches = token_batches(3, 4, cfg)
    with Ledger() as ledger:
        for cp in (3, 0):
            try:
                cg.make_mesh(cp)
            except ValueError as err:
                out[f"cp={cp}"] = str(err)
    out["sent"] = len(ledger.records)
    mesh = cg.make_mesh(2)
    for layout in ("zigzag", "contiguous"):
        out[layout] = cg.against_one_process(mesh, cfg, batches, layout=layout)
    device = runtime.device()  # the model and its batch on the rank's device
    model = cg.ContextGPT(TinyGPT(cfg).to(device), mesh.group("cp"))
    first = [(x.to(device), y.to(device)) for x, y in batches[:1]]
    with Ledger() as ledger:
        cg.train_dp_cp(model, first, mesh)
    want = cg.step_bytes(model, tuple(first[0][0].shape), mesh)
    out["step bytes"] = (ledger.bytes_sent(), want)
    layout = hybrid.Layout(dp=2, cp=2)  # chapter 8's Layout with its cp axis
    chapter8 = hybrid.make_mesh(layout)
    out["layout"] = cg.against_one_process(chapter8, cfg, batches)
    out["same grid"] = chapter8.coordinate == {**mesh.coordinate, "pp": 0, "tp": 0}
    model = cg.ContextGPT(TinyGPT(GPTConfig(block_size=12)), mesh.group("cp"))
    model.to(device)
    with Ledger() as ledger:
        try:
            model(torch.zeros(2, 5, dtype=torch.long, device=device))  # not 4 chunks
        except ValueError as err:
            out["sequence"] = str(err)
    out["sent seq"] = len(ledger.records)
    out["coordinate"] = (dist.get_rank(), mesh.coordinate)
    return out


runs = on_ranks(_run, 4, timeout=60)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_dp_x_cp_equals_one_process(runs: list, layout: str) -> None:
    for out in runs:
        grads, params = out[layout]
        assert grads <= 1e-5 and params <= 1e-5, (grads, params)


def test_chapter_8s_layout_with_cp_gives_the_same_mesh_and_run(runs: list) -> None:
    for out in runs:
        grads, params = out["layout"]
        assert grads <= 1e-5 and params <= 1e-5, (grads, params)
        assert out["same grid"] is True


def test_a_steps_wire_bytes_equal_the_formula(runs: list) -> None:
    for out in runs:
        sent, want = out["step bytes"]
        assert sent == want > 0


def test_the_mesh_puts_cp_innermost(runs: list) -> None:
    got = [out["coordinate"] for out in runs]
    assert got[1] == (1, {"dp": 0, "cp": 1})
    assert got[2] == (2, {"dp": 1, "cp": 0})


def test_bad_degrees_and_sequences_are_refused_before_any_collective(
    runs: list,
) -> None:
    for out in runs:
        assert out["cp=3"] == "cp=3 does not divide the world of 4 ranks"
        assert out["cp=0"] == "cp=0 does not divide the world of 4 ranks"
        assert out["sent"] == 0
        assert (
            "a sequence of 10 tokens does not split into 2 x cp = 4" in out["sequence"]
        )
        assert out["sent seq"] == 0

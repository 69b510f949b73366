"""The emulated GPU held to a real one (distcourse/emulate/recorder.py): every trace
recorded on a GPU in tests/data/gpu_traces/ is recorded again, the same program, on
the emulated box and diffed; each difference must be one that accepted.json lists
with its reason. A planted fault in the emulation (attention on the math path, as
the CPU's rules would pick for some shapes) shows as ops that differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from distcourse import emulate
from distcourse.emulate import recorder

TRACES = Path(__file__).parent / "data" / "gpu_traces"
ACCEPTED = json.loads((TRACES / "accepted.json").read_text())
emulate.setup()


def _stored() -> dict[str, str]:
    """Every stored GPU trace of a program the emulated box can run: its path under
    gpu_traces/ -> the program (from the file, or accepted.json for older ones)."""
    found = {name: entry["program"] for name, entry in ACCEPTED.items()}
    for path in sorted(TRACES.rglob("*.json")):
        program = json.loads(path.read_text()).get("program")
        if program in recorder.PROGRAMS:
            found[str(path.relative_to(TRACES))] = program
    return found


def _unaccepted(name: str, ours: list[list]) -> list[dict]:
    theirs = json.loads((TRACES / name).read_text())["ops"]
    listed = ACCEPTED.get(name, {}).get("accepted", [])  # none: every one fails
    allowed = {a["kind"]: a["most"] for a in listed}
    parts = recorder.diff(ours, theirs)
    counts = {k: sum(p["kind"] == k for p in parts) for k in allowed}
    return [
        p
        for p in parts
        if p["kind"] not in allowed or counts[p["kind"]] > allowed[p["kind"]]
    ]


def _on_rank(program: str) -> dict:
    from distcourse import runtime

    return recorder.record(program, runtime.device())


@pytest.mark.parametrize("name", sorted(_stored()))
def test_the_emulated_trace_matches_the_gpus(name: str) -> None:
    from distcourse.launch import spawn

    program = _stored()[name]
    if program == "ddp-digits":  # a rank of its own, as tools/record_traces.py
        trace = spawn(_on_rank, 1, program, backend="emulated", timeout=60)[0]
    else:
        trace = recorder.record(program, emulate.current())
    assert _unaccepted(name, trace["ops"]) == []
    theirs = json.loads((TRACES / name).read_text())
    assert trace["messages"] == theirs.get("messages", trace["messages"])
    assert (
        trace["device"].startswith("emulated") and trace["torch"] == torch.__version__
    )


def test_a_planted_attention_choice_shows_in_the_diff() -> None:
    with sdpa_kernel(SDPBackend.MATH):
        ops = recorder.tinygpt_autocast(emulate.current()).ops
    found = _unaccepted("h200-autocast-trace-2026-12-04.json", ops)
    names = {op[0] for part in found for op in part["theirs"]}
    assert "_scaled_dot_product_cudnn_attention" in names, found


def test_the_recorder_counts_saved_bytes_and_messages() -> None:
    trace = recorder.record("tinygpt-autocast", emulate.current())
    assert trace["messages"] == []  # one process, no collective
    assert trace["saved"]["blocks.0.attn"] > 0 and "head" in trace["saved"]
    assert all(len(op) == 3 for op in trace["ops"])  # name, dtypes, shapes


def _ddp_trace() -> tuple[list, list]:
    from distcourse import runtime

    trace = recorder.record("ddp-digits", runtime.device())
    return trace["messages"], [op[:2] for op in trace["ops"]]


def test_messages_and_ops_of_ddp_match_gloos() -> None:
    """Chapter 1's program on 2 emulated ranks sends what 2 gloo ranks send (c10d's
    names, bytes, order) and dispatches the same ops."""
    from distcourse.launch import spawn

    emulated = spawn(_ddp_trace, 2, backend="emulated", timeout=60)
    gloo = spawn(_ddp_trace, 2, backend="gloo", timeout=60)
    assert emulated == gloo
    names = [m[0] for m in emulated[0][0]]
    assert names.count("c10d.allreduce_") == 3 and "c10d.broadcast_" in names

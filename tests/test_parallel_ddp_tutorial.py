"""PyTorch's DDP tutorial programs, unchanged but for one import, with either DDP.

book/scripts/ddp_tutorial.py holds the tutorial's three programs (basic example with
mp.spawn and gloo, the checkpoint save/load habit, DDP over a model on two devices).
The checkpoint and two-device programs run here once with torch's
DistributedDataParallel and once with the import swapped for ours; every rank's final
parameters must be identical bit for bit. With 2 ranks an all-reduce sums two
numbers, which has one order only, so nothing excuses a bit. The basic program is
chapter 3b's own comparison (its cells run it with either DDP, under strict nbval
in `make test`; its negative controls are in tests/controls/test_03b_*.py): each
run of a program starts three interpreters, so it is not run a third time here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from distcourse.launch.script import OUR_DDP, TORCH_DDP, run_script, swapped

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "book" / "scripts" / "ddp_tutorial.py"
DEMOS = ("checkpoint", "model_parallel")  # "basic": chapter 3b runs it
REPORT = re.compile(r"\w+ rank \d: loss [-\d.]+, sum of parameters [-\d.]+")


def _run(tmp: Path, swap: tuple[str, str] | None) -> tuple[list[str], dict]:
    tmp.mkdir()
    out = run_script(
        SCRIPT, *DEMOS, swap=swap, env={"TUTORIAL_OUT": str(tmp)}, timeout=300
    )
    # two processes share one stdout, so lines may interleave: find the reports
    lines = sorted(REPORT.findall(out)) + [f"finished {out.count('Finished running')}"]
    states = {p.stem: torch.load(p, weights_only=True) for p in tmp.glob("*.pt")}
    return lines, states


@pytest.mark.timeout(900)  # 2 x 2 programs, each starting 3 interpreters
def test_the_tutorial_gives_identical_parameters_with_either_ddp(
    tmp_path: Path,
) -> None:
    torch_lines, torch_states = _run(tmp_path / "torch", None)
    our_lines, our_states = _run(tmp_path / "ours", (TORCH_DDP, OUR_DDP))
    assert sorted(torch_states) == sorted(f"{d}-{r}" for d in DEMOS for r in (0, 1))
    assert sorted(our_states) == sorted(torch_states)
    for key, theirs in torch_states.items():
        ours = our_states[key]
        assert list(ours) == list(theirs)
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), f"{key} {name}"
    for demo in DEMOS:  # DDP kept the replicas equal: rank 0's = rank 1's
        for name, value in torch_states[f"{demo}-0"].items():
            assert torch.equal(value, torch_states[f"{demo}-1"][name])
    assert len(torch_lines) == 2 * len(DEMOS) + 1
    assert torch_lines[-1] == f"finished {2 * len(DEMOS)}"
    assert torch_lines == our_lines  # the same reports, to 4 decimals


def test_the_swap_changes_exactly_the_import_line() -> None:
    text = SCRIPT.read_text()
    ours = swapped(text, (TORCH_DDP, OUR_DDP))
    diff = [
        (a, b)
        for a, b in zip(text.splitlines(), ours.splitlines(), strict=True)
        if a != b
    ]
    assert diff == [(TORCH_DDP, OUR_DDP)]

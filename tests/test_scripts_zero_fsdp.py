"""Programs written for PyTorch's ZeRO and FSDP2, run as written and with our imports.

book/scripts/zero_torch.py uses `torch.distributed.optim.ZeroRedundancyOptimizer`
beside torch's DDP; book/scripts/fsdp_torch.py uses FSDP2's `fully_shard` per layer
and on the root, and `get_model_state_dict(full_state_dict=True)`. Each runs on 2
ranks (mp.spawn, gloo) once as written and once with the imports swapped to
`distcourse.parallel.zero` / `distcourse.parallel.fsdp` (`full_state_dict` for the
state dict); either way its parameters after 3 steps of SGD and of AdamW equal one
process's within 1e-5, and each rank held about half of the optimizer state.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from distcourse.examples import sharding
from distcourse.launch.script import run_script, swapped

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "book" / "scripts"
WORLD = 2
ATOL = 1e-5
SWAPS = {
    "zero": [
        (
            "from torch.distributed.optim import ZeroRedundancyOptimizer",
            "from distcourse.parallel.zero import ZeroRedundancyOptimizer",
        )
    ],
    "fsdp": [
        (
            "from torch.distributed.fsdp import fully_shard",
            "from distcourse.parallel.fsdp import full_state_dict, fully_shard",
        ),
        (
            "    state = get_model_state_dict(model, options=full)",
            "    state = full_state_dict(model)",
        ),
    ],
}
HELD = re.compile(r"AdamW rank (\d): loss [\d.]+, optimizer state (\d+)")


def _run(program: str, tmp: Path, ours: bool) -> tuple[str, dict[str, dict]]:
    """Run `program` on WORLD ranks; its output and the states rank 0 saved."""
    out = tmp / ("ours" if ours else "torch")
    out.mkdir()
    text = run_script(
        SCRIPTS / f"{program}_torch.py",
        "--world",
        str(WORLD),
        "--out",
        str(out),
        swap=SWAPS[program] if ours else None,
        timeout=180,
    )
    states = {p.stem: torch.load(p, weights_only=True) for p in out.glob("*.pt")}
    return text, states


@pytest.mark.parametrize("program", sorted(SWAPS))
def test_the_program_trains_to_one_process_either_way(
    program: str, tmp_path: Path
) -> None:
    runs = {ours: _run(program, tmp_path, ours) for ours in (False, True)}
    for ours, (text, states) in runs.items():
        assert sorted(states) == [f"{program}-{k}-{WORLD}" for k in ("AdamW", "SGD")]
        for kind in ("SGD", "AdamW"):
            saved = states[f"{program}-{kind}-{WORLD}"]
            model = saved["model"] if program == "zero" else saved
            reference = sharding.one_process(WORLD, kind)
            assert sharding.max_difference(model, reference) <= ATOL, (ours, kind)
        if program == "zero":  # AdamW's two moments, for this rank's share only
            held = {int(r): int(n) for r, n in HELD.findall(text)}
            total = sum(p.numel() for p in sharding.uneven_mlp().parameters())
            assert sorted(held) == list(range(WORLD))
            assert sum(held.values()) == 2 * total
            assert max(held.values()) < 2 * total * 0.6
    if program == "zero":  # the consolidated optimizer state: torch's format
        _compare_optimizer_states(runs[False][1], runs[True][1])


def _compare_optimizer_states(theirs: dict, ours: dict) -> None:
    for key, saved in theirs.items():
        a, b = saved["optimizer"], ours[key]["optimizer"]
        assert a["param_groups"] == b["param_groups"]
        assert a["state"].keys() == b["state"].keys()
        for index, state in a["state"].items():
            for name, value in state.items():
                mine = b["state"][index][name]
                torch.testing.assert_close(mine, value, atol=ATOL, rtol=0)


@pytest.mark.parametrize("program", sorted(SWAPS))
def test_the_swap_changes_exactly_those_lines(program: str) -> None:
    text = (SCRIPTS / f"{program}_torch.py").read_text()
    ours = text
    for pair in SWAPS[program]:
        ours = swapped(ours, pair)
    diff = [
        (a, b)
        for a, b in zip(text.splitlines(), ours.splitlines(), strict=True)
        if a != b
    ]
    assert diff == SWAPS[program]

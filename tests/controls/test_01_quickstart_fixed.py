"""Negative control for chapter 1's checkpoint verdict (issue 31 item 4).

The chapter saves on rank 0, waits at a barrier, loads on every rank and prints
`checkpoint matches the trained model: True`. At a fixed path a file left by an
earlier run passed too, so removing the barrier could not fail. Here a stale
checkpoint is planted where the reader looks, as a reader that ran ahead of rank 0
would find it, and the chapter's check prints False; in the chapter's fresh
directory the same early reader finds no file at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distcourse import checks, runtime
from distcourse.examples import models


def _check_line(path: Path, trained: torch.nn.Module) -> str:
    """The chapter's cell: load `path` into a fresh model, compare with `trained`."""
    restored = models.digits_mlp()
    restored.load_state_dict(torch.load(path, map_location="cpu"))
    same = checks.max_difference(restored, trained) == 0
    return f"checkpoint matches the trained model: {same}"


@pytest.mark.controls(
    "01_quickstart",
    r"checkpoint matches the trained model",
    fault="a stale checkpoint from an earlier run read before rank 0 wrote",
)
def test_a_stale_checkpoint_fails(tmp_path: Path) -> None:
    runtime.seed_everything(1, per_rank=False)
    torch.save(models.digits_mlp().state_dict(), tmp_path / "quickstart.pt")  # stale
    runtime.seed_everything(0, per_rank=False)
    trained = models.digits_mlp()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)  # trained: not the weights any earlier run saved
    line = _check_line(tmp_path / "quickstart.pt", trained)  # rank 0 has not written
    assert line.endswith(": False")
    torch.save(trained.state_dict(), tmp_path / "quickstart.pt")  # now it has
    assert _check_line(tmp_path / "quickstart.pt", trained).endswith(": True")
    fresh = Path(tmp_path / "fresh") / "quickstart.pt"  # the chapter's new directory
    with pytest.raises(FileNotFoundError):
        _check_line(fresh, trained)  # an early reader there: an error, not a pass

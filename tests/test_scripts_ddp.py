"""Chapter 3's torchrun script: our DDP and torch's train the digits MLP alike."""

from __future__ import annotations

from helpers import run_python, torchrun


def _torchrun(impl: str) -> list[str]:
    """Run book/scripts/ddp_train.py on 2 ranks for 1 epoch; its stdout lines."""
    done = run_python(
        *torchrun(2), "book/scripts/ddp_train.py", "--impl", impl, "--epochs", "1"
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_our_ddp_and_torch_ddp_print_the_same_losses_under_torchrun() -> None:
    ours, theirs = _torchrun("ours"), _torchrun("torch")
    for lines, impl in ((ours, "ours"), (theirs, "torch")):
        assert [line[:8] for line in lines[:2]] == ["[rank 0]", "[rank 1]"]
        for line in lines[:2]:
            # 1,348 images / 2 ranks / batch 32 = 22 steps in one epoch
            assert line.startswith(f"[rank {line[6]}] {impl} DDP: 22 steps, losses ")
            assert line.endswith("parameters identical on all ranks: True")
        assert lines[2] == "global batch 64"
        assert float(lines[3].removeprefix("test accuracy ").rstrip("%")) > 70
    # the same averaged gradients: every printed loss agrees to 4 decimals
    strip = [line.split(" DDP: ", 1)[1] for line in ours[:2]]
    assert strip == [line.split(" DDP: ", 1)[1] for line in theirs[:2]]
    first, last = (float(v.rstrip(",")) for v in strip[0].split()[3:6:2])
    assert last < first  # it learns

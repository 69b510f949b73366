"""`%%ranks` on real ipyparallel engines started by cluster.start: 1, 2, 4, 8 ranks."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from distcourse.launch import cluster, ranks


@pytest.fixture(scope="module")
def shell() -> InteractiveShell:
    return InteractiveShell.instance()


@pytest.fixture(scope="module", params=[1, 2, 4, 8], ids=lambda n: f"{n}ranks")
def world(request: pytest.FixtureRequest, shell: InteractiveShell) -> Iterator[int]:
    started = cluster.start(request.param)  # registers %%px and %%ranks in `shell`
    yield request.param
    started.stop()


def _run(shell: InteractiveShell, cell: str) -> tuple[list[dict], object]:
    """Run a cell in the shell; its display bundles and its exception (or None)."""
    with capture_output() as cap:
        result = shell.run_cell(cell)
    return [out.data for out in cap.outputs], result.error_in_exec


def test_each_rank_gets_a_column_and_identical_lines_fold(
    shell: InteractiveShell, world: int
) -> None:
    outputs, error = _run(
        shell, '%%ranks\nprint(f"rank {rank} of {world_size}")\nprint("same here")'
    )
    assert error is None and len(outputs) == 1
    text, page = outputs[0]["text/plain"], outputs[0]["text/html"]
    mine = [f"[rank {r}] rank {r} of {world}" for r in range(world)]
    if world == 1:  # one rank folds nothing
        assert text.splitlines() == [*mine, "[rank 0] same here"]
    else:
        assert text.splitlines() == [*mine, "[all ranks] same here"]
        assert page.count("same here") == 1 and f'colspan="{world}"' in page
    assert re.findall(r"<th [^>]*>(.*?)</th>", page) == [
        f"rank {r}" for r in range(world)
    ]
    assert "white-space:pre-wrap" in page and "nowrap" not in page


def test_a_rank_that_prints_nothing_and_a_quiet_cell(
    shell: InteractiveShell, world: int
) -> None:
    if world < 2:
        pytest.skip("needs a second rank to stay quiet")
    outputs, error = _run(shell, '%%ranks\nif rank != 1:\n    print("hello")')
    assert error is None
    assert "[rank 0] hello" in outputs[0]["text/plain"]
    assert "[rank 1]" not in outputs[0]["text/plain"]
    assert "[all ranks]" not in outputs[0]["text/plain"]
    outputs, error = _run(shell, "%%ranks\nquiet = rank * 2")
    assert error is None and outputs == []  # like %%px: nothing printed, nothing shown
    assert cluster.current().pull("quiet", rank=world - 1) == 2 * (world - 1)


def test_an_exception_on_rank_two_names_rank_two(
    shell: InteractiveShell, world: int
) -> None:
    if world < 4:
        pytest.skip("needs a rank 2 and ranks after it")
    outputs, error = _run(shell, '%%ranks\nif rank == 2:\n    1 / 0\nprint("fine")')
    assert isinstance(error, ranks.RankCellError) and error.rank == 2
    assert str(error) == "rank 2 failed: ZeroDivisionError: division by zero"
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error._render_traceback_()))
    assert shown.startswith("[rank 2] ZeroDivisionError") and "1 / 0" in shown
    text = outputs[0]["text/plain"]
    assert "[rank 3] fine" in text and "[rank 2] fine" not in text
    assert text.endswith("[rank 2] raised ZeroDivisionError: division by zero")


def test_figures_come_from_rank_zero_or_from_every_rank(
    shell: InteractiveShell, world: int
) -> None:
    if world not in (1, 4):
        pytest.skip("figures are checked on 1 and 4 ranks")
    draw = (
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(2, 1.5))\n_ = ax.plot([0, rank])"
    )
    outputs, error = _run(shell, f"%%ranks\n{draw}")
    assert error is None
    assert [o["text/plain"] for o in outputs] == ["<figure 1 of rank 0>"]
    assert "image/png" in outputs[0]
    outputs, _ = _run(shell, f"%%ranks --figures all\n{draw}")
    assert [o["text/plain"] for o in outputs] == ["<figure 1: ranks side by side>"]
    outputs, _ = _run(shell, f"%%ranks --figures none\n{draw}")
    assert outputs == []
    outputs, error = _run(shell, f"%%ranks --figures {world}\nprint('ran')")
    assert isinstance(error, ValueError) and outputs == []  # refused before running

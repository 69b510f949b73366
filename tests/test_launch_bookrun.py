"""`make test-gpu`'s driver on small synthetic notebooks: verdicts, plan, report."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from distcourse import runtime
from distcourse.launch import bookrun


def _stream(text: str) -> nbformat.NotebookNode:
    return new_output("stream", name="stdout", text=text)


def _notebook_with_outputs() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell("The test must say: PASS"),  # prose is not output
        new_code_cell(
            "",
            outputs=[
                _stream(
                    "[stdout:0] \nby hand  max |4 ranks - one process| <= 1e-06: PASS\n"
                    "rank 1: parameters identical on all ranks: True\n"
                    "loss 0.1234, PASS rate 3 of 4\n"  # neither a verdict nor a claim
                )
            ],
        ),
        new_code_cell(
            "",
            outputs=[
                _stream("max |difference| = 1.2e-03 > 1e-06: FAIL\n"),
                new_output(
                    "execute_result",
                    data={"text/plain": "bit for bit: False"},
                    execution_count=1,
                ),
            ],
        ),
    ]
    return nb


def test_verdicts_are_the_pass_and_true_lines_the_rest_is_not_compared() -> None:
    passed, failed = bookrun.verdicts(_notebook_with_outputs())
    assert passed == [
        "by hand  max |4 ranks - one process| <= 1e-06: PASS",
        "rank 1: parameters identical on all ranks: True",
    ]
    assert failed == ["max |difference| = 1.2e-03 > 1e-06: FAIL", "bit for bit: False"]


def test_a_negative_stored_on_purpose_passes_only_word_for_word() -> None:
    stored = _notebook_with_outputs()
    expected = bookrun.expected_negatives(stored)
    assert "bit for bit: False" in expected
    passed, failed = bookrun.verdicts(stored, expected)
    assert failed == [] and len(passed) == 4
    rerun = _notebook_with_outputs()
    out = rerun.cells[1].outputs[0]
    out.text = out.text.replace("all ranks: True", "all ranks: False")
    _, failed = bookrun.verdicts(rerun, expected)  # a new False is still a failure
    assert failed == ["rank 1: parameters identical on all ranks: False"]


def test_every_passed_verdict_must_be_one_a_control_of_its_chapter_knows(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_marks.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.controls('01_a', r'max \\|a - b\\|', fault='b nudged')\n"
        "@pytest.mark.controls('01_a', r'^same', fault='one rank off')\n"
        "@pytest.mark.controls('01_a', r'two GPUs', fault='f', printed_on='2 GPUs')\n"
        "@pytest.mark.controls('02_b', r'max \\|c - d\\|', fault='d nudged')\n"
        "def test_a(): ...\n"
    )
    known = bookrun.controls(tmp_path)
    assert [c.notebook for c in known] == ["01_a", "01_a", "01_a", "02_b"]
    printed = ["max |a - b| <= 1e-06: PASS", "same: True", "one bucket hides: False"]
    assert bookrun.unknown("01_a", printed, known) == []  # "two GPUs": some boxes
    # (a False printed on purpose is in `passed`, matched against the stored line)
    renamed = ["max |a - b| <= 1e-06: PASS", "identical: True"]
    assert bookrun.unknown("01_a", renamed, known) == [
        "no control knows this verdict: identical: True",
        f"not printed: the verdict of {tmp_path.name}/test_marks.py:4 (^same)",
    ]
    other = bookrun.unknown("02_b", printed, known)  # another chapter's controls
    assert other[0] == "no control knows this verdict: max |a - b| <= 1e-06: PASS"


def test_the_book_s_own_controls_are_read_from_the_repository() -> None:
    known = bookrun.controls()
    assert len(known) > 100
    assert {c.notebook for c in known} >= {"01_quickstart", "12b_context"}


def _chapter(tmp_path: Path, name: str, *sources: str) -> Path:
    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def test_a_chapter_needs_its_written_rank_count_or_its_declared_minimum(
    tmp_path,
) -> None:
    four = _chapter(
        tmp_path, "a", "r = cluster.start(4)", "cluster.start(2, debug=True)"
    )
    spawned = _chapter(
        tmp_path, "b", "spawn(fn, 2)", "!torchrun --nproc-per-node 8 x.py"
    )
    none = _chapter(
        tmp_path, "c", "print(1)", "cluster.start()", "mp.spawn(f, args=(2,))"
    )
    any_count = _chapter(
        tmp_path, "d", "cluster.start(min(4, cluster.default_ranks()))"
    )
    nb = nbformat.read(any_count, as_version=4)
    nb.metadata["distcourse"] = {"min_ranks": 1}
    nbformat.write(nb, any_count)
    on_eight = bookrun.plan([four, spawned, none, any_count], "cuda", gpus=8)
    assert [(c.needs, c.runs) for c in on_eight] == [
        (4, True),
        (8, True),
        (0, True),
        (1, True),
    ]
    on_two = bookrun.plan([four, spawned, none, any_count], "cuda", gpus=2)
    assert [c.runs for c in on_two] == [False, False, True, True]
    dry = bookrun.plan([four, spawned, none, any_count], "cpu", gpus=0)
    assert all(c.runs for c in dry)  # gloo ranks: every chapter at its counts
    nb.cells.append(new_code_cell("cluster.start(2)"))  # declared 1, but starts 2
    nbformat.write(nb, any_count)
    with pytest.raises(ValueError, match="d: metadata says min_ranks=1, but a cell"):
        bookrun.plan([any_count], "cuda", gpus=8)


def test_on_one_gpu_chapter_1_and_the_labs_run_and_every_other_is_not_run() -> None:
    """The book as a box with one visible GPU sees it: pure planning, no GPU.

    Chapter 11 starts no notebook ranks (its labs spawn gloo ranks of their own), so
    it needs no GPU and runs on any box.
    """
    chapters = bookrun.plan(sorted(bookrun.BOOK.glob("*.ipynb")), "cuda", gpus=1)
    assert [c.name for c in chapters if c.runs] == ["01_quickstart", "11_debugging"]
    assert [c.needs for c in chapters if c.runs] == [1, 0]
    assert all(c.needs > 1 for c in chapters if not c.runs)
    chapters[0].passed = ["parameters vs one process: <= 1e-06: PASS"]
    text = bookrun.report(chapters, "a box with one GPU")
    for c in chapters:
        if not c.runs:
            assert f"{c.needs:>5}" in text and f"needs {c.needs} GPUs: not run" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line[:1].isdigit()}
    assert rows["01_quickstart"].endswith("  ok")
    others = len(chapters) - 2  # every chapter but the quick start and the labs
    assert f"chapters: 2 run, {others} not run (need more GPUs)" in text
    assert text.endswith("verdicts: 1 passed, 0 failed; PASS")  # not run: no failure
    assert bookrun.succeeded(chapters)
    chapters[0].failed = ["bit for bit: False"]
    assert not bookrun.succeeded(chapters)


def test_an_emulated_box_runs_every_chapter_at_its_count_and_says_so() -> None:
    """DISTCOURSE_DEVICE=emulated: as many emulated GPUs as each chapter needs, so
    every chapter runs at its written count, whatever the host has (pure planning)."""
    paths = sorted(bookrun.BOOK.glob("*.ipynb"))
    chapters = bookrun.plan(paths, "emulated", gpus=0)
    assert [c.name for c in chapters] == [p.stem for p in paths]
    assert all(c.runs for c in chapters)
    assert max(c.needs for c in chapters) > 1  # the written counts, not cut to one
    assert chapters == bookrun.plan(paths, "cpu", gpus=0)  # as the dry run plans
    where = bookrun.machine("emulated", gpus=0)
    assert "emulated GPU box" in where and "no real GPU ran" in where
    chapters[0].passed = ["parameters vs one process: <= 1e-06: PASS"]
    text = bookrun.report(chapters, where)
    assert text.startswith("Book run on an emulated GPU box")
    assert f"chapters: {len(chapters)} run, 0 not run" in text
    assert "not run" not in "".join(text.splitlines()[:-2])  # no chapter left out


def test_a_run_in_which_nothing_ran_or_nothing_was_checked_is_no_pass(
    tmp_path,
) -> None:
    eight = _chapter(tmp_path, "a", "cluster.start(8)")
    none = _chapter(tmp_path, "b", "print(1)")
    nothing_ran = bookrun.plan([eight], "cuda", gpus=1)
    text = bookrun.report(nothing_ran, "a test")
    assert "needs 8 GPUs: not run" in text
    assert text.endswith("verdicts: 0 passed, 0 failed; FAIL")
    assert not bookrun.succeeded(bookrun.plan([eight, none], "cuda", gpus=1))


def test_more_cuda_ranks_than_gpus_is_a_clear_error(monkeypatch) -> None:
    """What bookrun plans around stays an error when a chapter asks for it anyway."""
    from distcourse.launch import cluster

    monkeypatch.setattr(runtime, "gpu_count", lambda: 1)
    monkeypatch.setenv(runtime.DEVICE_VARIABLE, "cuda")
    assert min(4, cluster.default_ranks()) == 1  # chapter 1's count on one GPU
    with pytest.raises(ValueError, match="2 ranks on this host, 1 GPUs visible"):
        cluster.start(2)  # refused before any engine starts


def test_a_gpu_run_without_a_gpu_says_how_to_dry_run(monkeypatch, capsys) -> None:
    monkeypatch.setattr(runtime, "gpu_count", lambda: 0)
    monkeypatch.setenv(runtime.DEVICE_VARIABLE, "cuda")
    assert bookrun.main(["--out", "unused"]) == 2
    assert "DISTCOURSE_DEVICE=cpu make test-gpu" in capsys.readouterr().err


def test_dry_run_executes_copies_and_reports(tmp_path, monkeypatch, capsys) -> None:
    """Real kernels: cell errors and failed verdicts fail the run, the stored
    notebooks stay as they were, the executed copies land in --out."""
    good = _chapter(
        tmp_path,
        "01_good",
        "import os; print('device:', os.environ['DISTCOURSE_DEVICE'] == 'cpu')",
        "print('max |a - b| <= 1e-06: PASS')",
        "raise ValueError('shown on purpose')",
    )
    good_nb = nbformat.read(good, as_version=4)
    good_nb.cells[2].metadata["tags"] = ["raises-exception"]  # an error on purpose
    nbformat.write(good_nb, good)
    bad = _chapter(tmp_path, "02_bad", "print('same: False')", "1 / 0", "print(2)")
    stored = {p: p.read_bytes() for p in (good, bad)}
    marks = tmp_path / "controls"
    marks.mkdir()
    (marks / "test_marks.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.controls('01_good', r'^device', fault='f')\n"
        "@pytest.mark.controls('01_good', r'max \\|a - b\\|', fault='f')\n"
        "def test_a(): ...\n"
    )
    monkeypatch.setenv(runtime.DEVICE_VARIABLE, "cpu")
    out = tmp_path / "out"
    run = ["--out", str(out), "--controls", str(marks)]
    assert bookrun.main([str(good), *run]) == 0
    assert "01_good" in capsys.readouterr().out
    assert bookrun.main([str(good), str(bad), *run]) == 1
    report = (out / "report.txt").read_text()
    assert report.startswith("Book run on CPU dry run")
    assert "02_bad: cell error: ZeroDivisionError: division by zero" in report
    assert "02_bad: same: False" in report
    assert report.rstrip().endswith("verdicts: 2 passed, 1 failed; FAIL")
    assert {p: p.read_bytes() for p in (good, bad)} == stored  # never overwritten
    executed = nbformat.read(out / "02_bad.ipynb", as_version=4)
    assert executed.cells[0].outputs[0].text == "same: False\n"


@pytest.mark.parametrize("value", ["gpu", "nccl "])
def test_a_bad_device_variable_is_refused(monkeypatch, value: str) -> None:
    monkeypatch.setenv(runtime.DEVICE_VARIABLE, value)
    with pytest.raises(ValueError, match="use 'cpu' or 'cuda'"):
        bookrun.main([])

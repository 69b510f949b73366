"""run_script: a program in its own process, a swapped line, failures that say why."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from distcourse.launch.script import (
    PORT_FLOOR,
    by_rank,
    ephemeral_floor,
    excerpt,
    free_port,
    run_script,
    run_torchrun,
    swapped,
)
from distcourse.rendezvous import LOOPBACK


def test_swapped_replaces_exactly_one_whole_line() -> None:
    assert swapped("a\nb\nc\n", ("b", "x")) == "a\nx\nc\n"
    with pytest.raises(ValueError, match="found 0"):
        swapped("a\nbb\n", ("b", "x"))  # a part of a line is not the line
    with pytest.raises(ValueError, match="found 2"):
        swapped("b\nb\n", ("b", "x"))


def test_run_script_returns_stdout_with_its_environment(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text(
        "import os, tempfile\n"
        "print(os.environ['OMP_NUM_THREADS'], os.environ['MASTER_PORT'].isdigit())\n"
        "print(tempfile.gettempdir().startswith(os.environ['TMPDIR']), VALUE)\n"
    )
    out = run_script(
        script,
        swap=(
            "print(tempfile.gettempdir().startswith(os.environ['TMPDIR']), VALUE)",
            "print(tempfile.gettempdir() != '/tmp', 7)",
        ),
    )
    assert out.splitlines() == ["1 True", "True 7"]
    assert 0 < free_port() < 65536


def test_free_ports_lie_below_the_ephemeral_range_and_are_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below it, no outgoing connection or port-0 listener (gloo's) can take the
    port between the draw and the program's listen."""
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 10  # drawn at random: two test files rarely meet
    for port in ports:
        assert PORT_FLOOR <= port < ephemeral_floor()
    held_port, other = sorted(ports)[:2]
    with socket.socket() as held:  # a port in use is drawn, then skipped
        held.bind((LOOPBACK, held_port))
        held.listen()
        draws = iter([held_port, other])
        monkeypatch.setattr(  # the module's random is Python's: restored after
            "distcourse.launch.script.random.SystemRandom",
            lambda: SimpleNamespace(randrange=lambda low, high: next(draws)),
        )
        assert free_port() == other


def test_a_failing_script_raises_with_its_error(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit('no GPU here')\n")
    with pytest.raises(RuntimeError, match="fail.py exited with 1:\nno GPU here"):
        run_script(script)


def test_excerpt_takes_imports_and_named_definitions(tmp_path: Path) -> None:
    source = tmp_path / "prog.py"
    source.write_text(
        '"""doc"""\nimport os\n\nX = 1\n\n\ndef f():\n    return X\n\n\n'
        "class C:\n    pass\n\n\ndef g():\n    pass\n"
    )
    assert excerpt(source, "f", "C") == (
        "import os\n\n\ndef f():\n    return X\n\n\nclass C:\n    pass"
    )
    assert excerpt(source, "g", imports=False) == "def g():\n    pass"
    with pytest.raises(ValueError, match=r"defines no \['h'\]"):
        excerpt(source, "h")


def test_by_rank_sorts_lines_by_the_rank_they_name() -> None:
    out = "on rank 1.\nrank 0: a\n\nrank 1: b\nrank 0: c\n"
    assert by_rank(out, 3) == [
        ["rank 0: a", "rank 0: c"],
        ["on rank 1.", "rank 1: b"],
        [],
    ]
    assert by_rank("gpu 1 done\n", 2, r"gpu (\d)") == [[], ["gpu 1 done"]]
    with pytest.raises(ValueError, match="names no rank: 'hello'"):
        by_rank("rank 0: a\nhello\n", 2)
    with pytest.raises(ValueError, match="rank 2 of 2"):
        by_rank("rank 2: a\n", 2)
    assert by_rank("ranks 0 and 1 agree\n", 2, r"(\d)") == [["ranks 0 and 1 agree"], []]


SPEAKERS = """\
import multiprocessing as mp


def speak(rank):
    for step in range(100):
        print(f"rank {rank}: step", end="")
        print(f" {step}")


if __name__ == "__main__":
    procs = [mp.get_context("spawn").Process(target=speak, args=(r,)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
"""


def test_lines_of_processes_printing_at_once_arrive_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")  # would cut lines between processes
    script = tmp_path / "speakers.py"
    script.write_text(SPEAKERS)
    out = run_script(script)
    assert by_rank(out, 2) == [
        [f"rank {r}: step {s}" for s in range(100)] for r in (0, 1)
    ]


def test_run_torchrun_restarts_a_group_whose_rank_died(tmp_path: Path) -> None:
    """4 ranks join, rank 1 dies by SIGKILL on the first attempt, torchrun starts
    all 4 again and they join and all-reduce: runtime.init_from_env keeps each
    attempt's keys apart in the store (with the dead attempt's keys, gloo read a
    dead rank's address: "Connection refused", then a barrier timeout)."""
    script = tmp_path / "die_once.py"
    script.write_text(
        "import os, signal, torch, torch.distributed as dist\n"
        "from distcourse import runtime\n"
        "info = runtime.init_from_env()\n"
        "attempt = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "if info.rank == 1 and attempt == '0':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "total = torch.ones(1)\n"
        "dist.all_reduce(total)\n"
        "print(f'rank {info.rank} attempt {attempt} sum {total.item():.0f}')\n"
        "runtime.shutdown()\n"
    )
    env = {"DISTCOURSE_DEVICE": "cpu"}
    done = run_torchrun(script, ranks=4, max_restarts=1, env=env)
    # 4 processes share the pipe: one's line may land in the middle of another's
    ranks = sorted(re.findall(r"rank (\d) attempt 1 sum 4", done.stdout))
    assert ranks == ["0", "1", "2", "3"], done.stdout
    assert "exitcode: -9" in done.stderr
    dies = tmp_path / "dies.py"
    dies.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match="exited with 1"):
        run_torchrun(dies, ranks=2)  # no restart: a failed rank ends the run

"""Stored benchmark runs: the quiet check refuses a busy machine, provenance travels
with the data, and what the chapters store can be read back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distcourse.bench import record


def _spinner() -> int:
    """The PID of a process spinning on a core that is not this one's descendant:
    its shell exits at once and init adopts it. `Quiet` counts this process's tree
    as the run's own (a spawned rank is a descendant), so a spinner started with
    Popen was the run's, and only the other test workers' time showed as others'
    (0.92 and 1.125 cores in two loaded CI runs; alone, none)."""
    spin = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
    done = subprocess.run(["sh", "-c", spin], capture_output=True, text=True)
    return int(done.stdout)


def test_other_programs_during_a_run_are_measured_and_refused() -> None:
    """Two processes spinning beside a run that sleeps: their processor time is not
    the run's, so it shows as other programs' (at least the two cores they ask
    for, or the whole machine where it has fewer), and the run is not quiet."""
    spinners = [_spinner() for _ in range(2)]
    try:
        time.sleep(0.5)  # running before the run starts
        with record.Quiet() as quiet:
            time.sleep(1.5)
    finally:
        for pid in spinners:
            os.kill(pid, signal.SIGKILL)
    assert quiet.others is not None and quiet.others >= min(2, quiet.cores) * 0.7
    if quiet.cores <= 2:
        assert any("other programs used" in p for p in quiet.problems())
    assert quiet.seconds >= 1.5


def test_a_run_is_quiet_below_half_a_core_of_load_and_of_others() -> None:
    calm = record.Quiet(cores=2, load_before=(0.9, 0.5, 0.2), others=0.2)
    assert calm.problems() == []
    busy = record.Quiet(cores=2, load_before=(1.1, 0.5, 0.2), others=0.2)
    assert busy.problems() == [
        "load average 1.1 before the run on 2 cores (at most 0.5 a core)"
    ]
    shared = record.Quiet(cores=2, load_before=(0.1,), others=1.3)
    assert shared.problems() == [
        "other programs used 1.30 cores during the run (at most 0.5 a core)"
    ]


def test_store_refuses_a_busy_run_or_keeps_it_flagged(tmp_path: Path) -> None:
    busy = record.Quiet(cores=2, load_before=(3.0, 2.0, 1.0), others=0.0)
    with pytest.raises(record.NotQuiet, match="load average 3.0 before the run"):
        record.store("x", {"a": 1}, busy, root=tmp_path, ranks=2)
    assert not (tmp_path / "x.json").exists()
    where = record.store("x", {"a": 1}, busy, keep_busy=True, root=tmp_path, ranks=2)
    kept = json.loads(where.read_text())
    assert kept["data"] == {"a": 1} and kept["provenance"]["quiet"] is False
    back = record.load("x", root=tmp_path)
    assert back is not None and back.data == {"a": 1}
    assert back.describe().endswith("NOT QUIET: no reference")


def test_a_quiet_run_is_stored_with_its_provenance(tmp_path: Path) -> None:
    calm = record.Quiet(cores=2, load_before=(0.3, 0.2, 0.1), others=0.05)
    calm.load_after, calm.seconds = (1.9, 0.6, 0.2), 42.0
    record.store("y", {"b": [1, 2]}, calm, root=tmp_path, ranks=2, threads_per_rank=1)
    got = record.load("y", root=tmp_path)
    assert got is not None
    p = got.provenance
    assert p["quiet"] is True and p["cores"] == 2 and p["ranks"] == 2
    assert p["load_average_before"] == [0.3, 0.2, 0.1] and p["seconds"] == 42.0
    assert p["torch"] and p["machine"] and p["date"][:2] == "20"
    line = got.describe()
    assert "2 cores" in line and "2 ranks of 1 thread(s)" in line
    assert "load average 0.3 before, others 0.05 cores" in line
    assert record.load("absent", root=tmp_path) is None
    assert "python -m distcourse.bench z --store" in record.missing(
        "z", "python -m distcourse.bench z --store"
    )


def test_every_stored_run_of_the_book_is_quiet_and_complete() -> None:
    """Whatever book/measurements holds under the record's format was measured on a
    quiet machine, with its provenance (a busy run is never the reference)."""
    for path in sorted(record.MEASUREMENTS.glob("ch*.json")):
        got = record.load(path.stem)
        assert got is not None
        p = got.provenance
        assert p["quiet"] is True, (path.name, got.describe())
        for key in ("date", "machine", "cores", "load_average_before", "torch"):
            assert p.get(key) not in (None, ""), (path.name, key)


def test_finish_prints_the_run_then_refuses_to_store_a_busy_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A benchmark's end: the run is printed whatever happens; storing a busy run
    fails with the reason on stderr and exit code 1, nothing written."""
    args = record.parser("z", "z").parse_args(["--store"])
    busy = record.Quiet(cores=2, load_before=(3.0,), others=0.0)
    shown: list[str] = []
    code = record.finish("z", {"a": 1}, busy, lambda r: shown.append(r.name), args)
    out, err = capsys.readouterr()
    assert code == 1 and shown == ["z"] and "load average 3.0 before the run" in err
    assert not record.path("z").exists()
    calm = record.Quiet(cores=2, load_before=(0.1,), others=0.0)
    as_json = record.parser("z", "z").parse_args(["--json"])
    assert record.finish("z", {"a": 1}, calm, print, as_json, ranks=2) == 0
    assert '"data": {"a": 1}' in capsys.readouterr().out


def test_configured_picks_the_quick_config_with_the_stored_run_options() -> None:
    """--quick picks the first config, its absence the second; --json, --store and
    --keep-busy come with it, as `parser` gives them."""
    cfg, args = record.configured("z", "z", ["--quick", "--json"], "q", ("a", "b"))
    assert cfg == "a" and args.json and not args.store
    cfg, args = record.configured("z", "z", ["--store", "--keep-busy"], "q", ("a", "b"))
    assert cfg == "b" and args.store and args.keep_busy and not args.quick


def test_measured_runs_the_picked_config_under_quiet() -> None:
    """`measured` measures the config `configured` picks, inside a Quiet that has
    watched the run (its load before and after, its length), and hands back both."""
    seen = []
    cfg, args, data, quiet = record.measured(
        "z", "z", ["--quick"], "q", ("a", "b"), lambda c: seen.append(c) or c * 2
    )
    assert (cfg, data, seen) == ("a", "aa", ["a"]) and args.quick and not args.json
    assert quiet.load_before and quiet.load_after and quiet.seconds >= 0


def _spin(seconds: float) -> float:
    """Spin for `seconds` of wall time; return this rank's processor seconds."""
    start, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - start < seconds:
        pass
    return time.process_time() - cpu


def test_a_runs_own_ranks_count_as_its_own_not_as_other_programs() -> None:
    """spawn's ranks are children of its forkserver, not of this process: their
    processor time still counts as the run's own, so a quiet machine running
    busy ranks is not taken for a busy one."""
    from distcourse.launch import spawn

    spawn(_spin, 2, 0.05)  # the forkserver up before measuring
    before = record.own_seconds()
    cpu = spawn(_spin, 2, 1.0)
    after = record.own_seconds()
    assert after - before >= 0.9 * sum(cpu), (after - before, cpu)

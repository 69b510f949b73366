"""The project's own promises: one dependency list, a working self-check and script."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml
from helpers import run_python, torchrun

from distcourse import envcheck

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> set[str]:
    """The package's dependencies and those of the extras `make` installs, as ranges."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return set(project["dependencies"]).union(*(extras[x] for x in envcheck.EXTRAS))


def test_environment_yml_pins_pyprojects_dependencies_to_the_locked_versions() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    pins = dict(line.split("==") for line in pip)
    names = {re.match(r"[A-Za-z0-9._-]+", r)[0] for r in _pyproject_requirements()}
    assert set(pins) == names
    locked = envcheck.read_lock(ROOT / envcheck.LOCK_NAME)
    wrong = [
        f"{name}=={version} (lock: {locked.get(envcheck.canonical(name))})"
        for name, version in pins.items()
        if locked.get(envcheck.canonical(name)) != version
    ]
    assert not wrong, (
        f"environment.yml pins differ from {envcheck.LOCK_NAME}: {', '.join(wrong)}; "
        "re-pin with `python -m distcourse.envcheck environment.yml`"
    )
    assert "python=3.11" in env["dependencies"]


def test_self_check_reports_the_machine_and_runs_an_all_reduce() -> None:
    done = run_python("-m", "distcourse", "check")
    assert done.returncode == 0, done.stderr
    assert f"torch      {__import__('torch').__version__}" in done.stdout
    assert "\nsupported  torch>=2.11,<2.15 (tested: " in done.stdout
    assert " is inside it\n" in done.stdout  # the torch running the tests
    for name in envcheck.KEY_PACKAGES:  # each key version beside the locked one
        assert f"\n  {name} " in done.stdout
    assert f"installed      {envcheck.LOCK_NAME}\n" in done.stdout
    assert "all_reduce of rank+1 on 2 ranks: [3.0, 3.0]" in done.stdout
    assert done.stdout.rstrip().endswith("OK")


def test_quickstart_script_trains_under_torchrun() -> None:
    done = run_python(
        *torchrun(2),
        "book/scripts/quickstart_ddp.py",
        "--epochs",
        "2",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line[:8] for line in lines[:2]] == ["[rank 0]", "[rank 1]"]
    assert "110 steps" not in done.stdout and "44 steps" in done.stdout
    accuracy = float(lines[2].removeprefix("test accuracy ").rstrip("%"))
    assert accuracy > 80


def test_startup_benchmark_reports_a_breakdown() -> None:
    done = run_python("-m", "distcourse.bench", "startup", "--json", "--ranks", "2")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["breakdown"]) >= {"engines", "process group", "total"}
    assert report["ranks"] == 2

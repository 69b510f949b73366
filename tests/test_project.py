"""The project's own promises: one dependency list, a working self-check and script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from distcourse import envcheck

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return set(project["dependencies"]) | set(extras["book"]) | set(extras["test"])


def test_environment_yml_lists_the_same_dependencies_as_pyproject() -> None:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert set(pip) == _pyproject_requirements()
    assert "python=3.11" in env["dependencies"]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout,
        cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


def test_self_check_reports_the_machine_and_runs_an_all_reduce() -> None:
    done = _run("-m", "distcourse", "check")
    assert done.returncode == 0, done.stderr
    assert f"torch      {__import__('torch').__version__}" in done.stdout
    for name in envcheck.KEY_PACKAGES:  # each key version beside the locked one
        assert f"\n  {name} " in done.stdout
    assert f"installed      {envcheck.LOCK_NAME}\n" in done.stdout
    assert "all_reduce of rank+1 on 2 ranks: [3.0, 3.0]" in done.stdout
    assert done.stdout.rstrip().endswith("OK")


def test_quickstart_script_trains_under_torchrun() -> None:
    done = _run(
        "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "book/scripts/quickstart_ddp.py", "--epochs", "2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line[:8] for line in lines[:2]] == ["[rank 0]", "[rank 1]"]
    assert "110 steps" not in done.stdout and "44 steps" in done.stdout
    accuracy = float(lines[2].removeprefix("test accuracy ").rstrip("%"))
    assert accuracy > 80


def test_startup_benchmark_reports_a_breakdown() -> None:
    done = _run("-m", "distcourse.bench", "startup", "--json", "--ranks", "2")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["breakdown"]) >= {"engines", "process group", "total"}
    assert report["ranks"] == 2

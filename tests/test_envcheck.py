"""The environment has the locked versions, and a reader whose does not is told why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distcourse import envcheck

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / envcheck.LOCK_NAME
# The pins this environment was installed from: the lock, or (`make test-compat`) the
# lock without the lines of torch and what torch pins, for the oldest supported torch.
INSTALLED_FROM = Path(os.environ.get("DISTCOURSE_LOCK", LOCK))


def test_running_environment_matches_the_lock() -> None:
    differences = envcheck.check_environment(INSTALLED_FROM)
    assert not differences, envcheck.format_differences(differences, INSTALLED_FROM)


def test_the_lock_covers_every_direct_dependency() -> None:
    locked = envcheck.read_lock(LOCK)
    required = envcheck.required_names()
    assert {"torch", "torchvision", "ipyparallel", "nbval"} <= required
    assert required - set(locked) == set()


def _with_pin(tmp_path: Path, name: str, version: str) -> Path:
    """A copy of the lock in which `name` is pinned to `version`."""
    lines = INSTALLED_FROM.read_text().splitlines()
    pinned = [
        f"{name}=={version}" if line.startswith(f"{name}==") else line for line in lines
    ]
    assert pinned != lines, f"{name} is not in the lock"
    copy = tmp_path / envcheck.LOCK_NAME
    copy.write_text("\n".join(pinned) + "\n")
    return copy


def test_a_changed_pin_is_named_with_the_command_that_fixes_it(tmp_path: Path) -> None:
    lock = _with_pin(tmp_path, "nbval", "0.10.0")
    differences = envcheck.check_environment(lock)
    installed = envcheck.installed_versions()["nbval"]
    assert differences == [envcheck.Difference("nbval", "0.10.0", installed)]
    message = envcheck.format_differences(differences, lock)
    assert f"nbval  installed {installed}, locked 0.10.0" in message
    assert message.startswith("1 package in this environment differs from ")
    assert "make -B venv" in message
    assert 'pip install -c requirements.lock -e ".[book,test,vision]"' in message


def test_the_self_check_report_flags_a_changed_key_pin(tmp_path: Path) -> None:
    lock = _with_pin(tmp_path, "ipyparallel", "9.0.0")
    report = "\n".join(envcheck.key_versions_report(lock))
    assert "  ipyparallel" in report and "9.0.0          DIFFERS" in report
    assert "make -B venv" in report


def test_compare_missing_extra_and_local_versions() -> None:
    locked = {"torch": "2.14.1", "nvidia-nccl-cu13": "2.30.7", "nbval": "0.11.0"}
    locked |= {"pip": "26.3"}
    installed = {"torch": "2.14.1+cpu", "my-own-tool": "1.0", "pip": "24.0"}
    # a CPU torch satisfies the pin; the CUDA-only wheel may be absent; a direct
    # dependency may not; a package the lock does not know, and pip, are not reported
    assert envcheck.compare(locked, installed, required={"torch", "nbval"}) == [
        envcheck.Difference("nbval", "0.11.0", None)
    ]
    assert not envcheck.version_matches("2.14.1+cu130", "2.14.1+cpu")
    assert not envcheck.version_matches("2.14.1", "2.14.10")


def test_read_lock_normalises_names_and_rejects_what_is_not_a_pin(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "lock.txt"
    lock.write_text("# made by hand\n\nJinja2==3.1.6\ntyping_extensions==4.16.0 ; x\n")
    assert envcheck.read_lock(lock) == {
        "jinja2": "3.1.6",
        "typing-extensions": "4.16.0",
    }
    lock.write_text("numpy>=2\n")
    with pytest.raises(ValueError, match="lock.txt:1: not a `name==version` pin"):
        envcheck.read_lock(lock)


def test_environment_yml_is_pinned_in_its_pip_list_only() -> None:
    text = "# conda\ndependencies:\n  - python=3.11\n  - pip\n  - pip:\n"
    text += "      - torch>=2.4\n      - PyYAML\nname: x\n"
    locked = {"torch": "2.14.1", "pyyaml": "6.0.3", "pip": "26.3"}
    assert envcheck.pin_environment_yml(text, locked) == (
        "# conda\ndependencies:\n  - python=3.11\n  - pip\n  - pip:\n"
        "      - torch==2.14.1\n      - PyYAML==6.0.3\nname: x\n"
    )
    with pytest.raises(ValueError, match="numpy is not in the lock"):
        envcheck.pin_environment_yml("- pip:\n  - numpy\n", locked)

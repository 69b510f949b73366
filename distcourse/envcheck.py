"""Does this environment have the versions in `requirements.lock`?

The notebooks are checked by strict nbval, character for character, and their stored
outputs hold matplotlib reprs, tqdm bars and torch numerics; the package also subclasses
ipyparallel's launchers. So the versions matter, and `make` installs exactly the ones
in the lock. This module reads the lock, compares it with what is installed here and
says, package by package, what differs and which command fixes it. Names and versions
are read by `packaging`, with the rules pip itself applies. Used by
`tests/test_envcheck.py` and by `python -m distcourse check`.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from distcourse import tables

LOCK_NAME = "requirements.lock"
# The extras that `make` installs, so the ones the lock covers.
EXTRAS = ("book", "test", "vision")
# What `python -m distcourse check` shows: the libraries whose behaviour shows most in
# the stored outputs (torch numerics), the package's internals (ipyparallel) and the
# tools that build and check the book.
KEY_PACKAGES = ("torch", "ipyparallel", "jupyter-book", "nbval")
# Locked (`make venv` installs it) but not compared: the installer's version never
# shows in an output, and the pip command below, which fixes every other difference,
# would not change it, since nothing requires pip.
NOT_COMPARED = frozenset({"pip"})
FIX_COMMANDS = (
    "make -B venv",
    f'python -m pip install -c {LOCK_NAME} -e ".[{",".join(EXTRAS)}]"',
)


def canonical(name: str) -> str:
    """PEP 503 form of a project name: `Jupyter_Book` and `jupyter-book` are one."""
    return canonicalize_name(name)


def _requirement(text: str) -> Requirement | None:
    """`text` as a requirement (`torch>=2.4`, `numpy==2.4.6`), or None."""
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def default_lock_path() -> Path:
    """The lock beside the package's source tree (an editable or in-repo install)."""
    return Path(__file__).resolve().parents[1] / LOCK_NAME


def read_lock(path: Path) -> dict[str, str]:
    """Pins of a `pip freeze`-style lock, as {canonical name: version}.

    Blank lines and `#` comments are skipped, and so is an environment marker after
    `;`. Any other line that is not `name==version` is an error, so that a lock
    edited by hand into something pip would read differently is caught here.
    """
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        req = _requirement(line)
        specs = list(req.specifier) if req and not (req.extras or req.url) else []
        if len(specs) != 1 or specs[0].operator != "==":
            raise ValueError(f"{path}:{number}: not a `name==version` pin: {raw!r}")
        pins[canonical(req.name)] = specs[0].version
    return pins


def installed_versions() -> dict[str, str]:
    """{canonical name: version} of every distribution importable here.

    Where one name is installed twice on `sys.path`, the first one wins, as it does
    for `import`.
    """
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist.version)
    return found


def required_names(project: str = "distcourse") -> set[str]:
    """Canonical names of `project`'s direct dependencies, extras included.

    Empty when the project is not installed as a distribution. A direct dependency
    that is missing is a difference; a locked transitive one need not be, since some
    exist only on some platforms or builds (CUDA's `nvidia-*` wheels are not installed
    with a CPU-only torch).
    """
    try:
        requirements = importlib.metadata.requires(project) or []
    except importlib.metadata.PackageNotFoundError:
        return set()
    return {canonical(req.name) for req in map(_requirement, requirements) if req}


def version_matches(locked: str, installed: str) -> bool:
    """True if `installed` satisfies `==locked` as pip reads it.

    A pin without a local label ignores the installed one's: `torch==2.14.1` accepts
    `2.14.1+cpu` from the CPU wheel index (`make venv TORCH_INDEX=...`), as pip does
    when it installs with the lock as constraints.
    """
    try:
        return Version(installed) in SpecifierSet(f"=={locked}")
    except InvalidVersion:  # not PEP 440: only the same text matches
        return installed == locked


@dataclass(frozen=True)
class Difference:
    """One locked package whose installed version is not the locked one."""

    name: str
    locked: str
    installed: str | None  # None: not installed


def compare(
    locked: Mapping[str, str],
    installed: Mapping[str, str],
    required: Iterable[str] = (),
) -> list[Difference]:
    """The locked packages that differ here, sorted by name.

    A locked package installed at another version always differs; one not installed
    differs only if it is in `required`. Installed packages the lock does not name are
    not reported: they were added by hand and do not change what the book runs.
    pip (`NOT_COMPARED`) is skipped.
    """
    needed = {canonical(name) for name in required}
    differences = []
    for name, version in sorted(locked.items()):
        if name in NOT_COMPARED:
            continue
        have = installed.get(name)
        if have is None:
            if name in needed:
                differences.append(Difference(name, version, None))
        elif not version_matches(version, have):
            differences.append(Difference(name, version, have))
    return differences


def check_environment(lock: Path | None = None) -> list[Difference]:
    """Compare the running environment with `lock` (default: the repository's)."""
    lock = default_lock_path() if lock is None else lock
    return compare(read_lock(lock), installed_versions(), required_names())


def format_differences(differences: list[Difference], lock: Path) -> str:
    """A message for a reader whose notebook output differs: what, why, and the fix."""
    if not differences:
        return f"This environment matches {lock}."
    rows = []
    for package in differences:
        installed = package.installed
        have = "not installed" if installed is None else f"installed {installed}"
        rows.append(("  " + package.name, f"{have}, locked {package.locked}"))
    count = len(differences)
    return "\n".join(
        [
            f"{count} package{'s' if count > 1 else ''} in this environment "
            f"{'differ' if count > 1 else 'differs'} from {lock}:",
            tables.aligned(rows, gaps=2),
            "The stored notebook outputs were made with the locked versions, so strict",
            "nbval may report differences. Install the locked versions: in the",
            f"repository, `{FIX_COMMANDS[0]}` (re-installs .venv from the lock), or in",
            f"another environment `{FIX_COMMANDS[1]}`.",
        ]
    )


def pin_environment_yml(text: str, locked: Mapping[str, str]) -> str:
    """`environment.yml` with each package of its `pip:` list pinned as in the lock.

    Conda users get the direct dependencies at the locked versions; `make lock` calls
    this (through `python -m distcourse.envcheck environment.yml`) so the two never
    disagree. Only the `pip:` list changes: comments and conda's own entries stay.
    """
    out, pip_indent = [], None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if pip_indent is not None and line.strip() and indent <= pip_indent:
            pip_indent = None  # left the pip list
        req = _requirement(line.strip().removeprefix("- "))
        if pip_indent is not None and line.strip().startswith("- ") and req:
            name = req.name
            if canonical(name) not in locked:
                raise ValueError(f"environment.yml: {name} is not in the lock")
            line = f"{line[:indent]}- {name}=={locked[canonical(name)]}"
        elif line.strip() == "- pip:":
            pip_indent = indent
        out.append(line)
    return "\n".join(out) + "\n"


def key_versions_report(lock: Path | None = None) -> list[str]:
    """Lines for `python -m distcourse check`: the key versions, then the verdict.

    A reader whose notebook output differs from the stored one sees here at once
    whether this environment has the versions the outputs were made with.
    """
    lock = default_lock_path() if lock is None else lock
    installed = installed_versions()
    locked = read_lock(lock) if lock.is_file() else {}
    rows = [("versions", "installed", LOCK_NAME)]
    for name in KEY_PACKAGES:
        have, want = installed.get(name), locked.get(name)
        same = have is not None and want is not None and version_matches(want, have)
        verdict = "" if not locked else " ok" if same else " DIFFERS"
        rows.append(("  " + name, have or "-", want or "-", verdict))
    lines = tables.aligned(rows, widths=(15, 14, 14, 0), gaps=(1, 1, 0)).splitlines()
    if not locked:
        return [*lines, f"lock       {lock} not found: versions not compared"]
    differences = compare(locked, installed, required_names())
    if differences:
        return [*lines, *format_differences(differences, lock).splitlines()]
    here = sum(name in installed for name in locked)
    return [
        *lines,
        f"lock       {here} of {len(locked)} locked packages installed here, "
        "all at the locked version",
    ]


if __name__ == "__main__":
    import sys

    # `python -m distcourse.envcheck environment.yml`: pin its pip list to the lock.
    pins = read_lock(default_lock_path())
    for target in map(Path, sys.argv[1:]):
        target.write_text(pin_environment_yml(target.read_text(), pins))

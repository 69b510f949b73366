"""distcourse.torchcompat: each torch difference behaves alike on every supported torch
(`make test` runs this on the locked torch, `make test-compat` on the oldest)."""

from __future__ import annotations

import time
import tomllib
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from packaging.requirements import Requirement
from packaging.version import Version

from distcourse import torchcompat
from distcourse.launch import spawn

ROOT = Path(__file__).resolve().parents[1]


def _partner_never_comes() -> tuple[float, str] | None:
    """Rank 0 all-reduces on a group made with a 30-minute timeout and then given
    1 s; rank 1 never joins it (but stays alive, so only the timeout can end it)."""
    group = dist.new_group([0, 1], timeout=timedelta(minutes=30))
    torchcompat.set_group_timeout(group, timedelta(seconds=1))
    if dist.get_rank() == 1:
        time.sleep(6)
        return None
    start = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(1), group=group)
    except RuntimeError as err:
        return time.perf_counter() - start, str(err)
    return time.perf_counter() - start, "no error"


def test_a_group_timeout_set_later_applies() -> None:
    took, message = spawn(_partner_never_comes, 2, timeout=30)[0]
    assert "timed out" in message.lower(), message
    assert took < 5, f"waited {took:.1f} s for a 1 s timeout"


def test_the_range_is_pyprojects_and_the_report_says_where_torch_is() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_req = [Requirement(r) for r in project["dependencies"]]
    (declared,) = [r.specifier for r in torch_req if r.name == "torch"]
    assert declared == torchcompat.SUPPORTED
    assert all(torchcompat.is_supported(Version(v)) for v in torchcompat.TESTED)
    assert torchcompat.is_supported()  # the torch running this test
    inside = torchcompat.support_report(Version("2.11.0"))
    assert inside.startswith("supported  torch>=2.11,<2.15 (tested: 2.11.0, 2.14.1)")
    assert inside.endswith("installed 2.11.0 is inside it")
    outside = torchcompat.support_report(Version("2.15.0"))
    assert "installed 2.15.0 is OUTSIDE it" in outside
    assert not torchcompat.is_supported(Version("2.10.0"))
    assert torchcompat.at_least("2.11") and not torchcompat.at_least("99.0")

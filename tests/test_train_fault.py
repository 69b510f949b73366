"""The fault drill's pieces: --kill's parsing, the first attempt only, and a
forward pass that ends its process by SIGKILL (in a child process here; the
whole drill under torchrun is in test_scripts_train_gpt.py)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from distcourse.train import fault

ARMED = """
import torch
from distcourse.train import fault
layer = torch.nn.Linear(2, 2)
layer(torch.ones(2))
print("before", flush=True)
fault.kill_in_forward(layer)
layer(torch.ones(2))
print("after", flush=True)
"""


def test_parse_takes_rank_colon_step() -> None:
    assert fault.parse("1:5") == (1, 5)
    for bad in ("1", "1:0", "a:2", "-1:2", "1:2:3"):
        with pytest.raises(ValueError, match="RANK:STEP"):
            fault.parse(bad)


def test_only_torchruns_first_attempt_is_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert fault.first_attempt()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert fault.first_attempt()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert not fault.first_attempt()


def test_an_armed_forward_kills_its_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ARMED], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "before\n"

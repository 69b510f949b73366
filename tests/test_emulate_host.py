"""`host_for` (distcourse/emulate/host.py): running something on the host under the
emulation is printed and recorded, never silent; elsewhere the device is kept."""

from __future__ import annotations

import torch

from distcourse import emulate

emulate.setup()


def test_host_for_names_what_ran_on_the_host(capsys) -> None:
    cpu = torch.device("cpu")
    assert emulate.host_for("plain CPU code", cpu) == cpu
    assert emulate.host_for("torch thing", torch.device("gpu", 0)) == cpu
    assert "torch thing runs on the host" in capsys.readouterr().out
    assert emulate.host_runs() == ["torch thing"]

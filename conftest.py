"""The test configuration: every pytest run here (tests/, book/, a bare `pytest
--nbval book/`) puts its ranks on gloo and the CPU, even on a GPU box.

The notebooks' stored outputs were made on CPU ranks (`backend=gloo, device=cpu`, CPU
arithmetic, the written rank counts), so only CPU ranks can reproduce them; the unit
tests' tensors live on the CPU too. The variable is set here, before any kernel,
engine or rank starts, and every child process inherits it (runtime.pick_backend and
cluster.default_ranks read it). A GPU run of the book is `make test-gpu`.
"""

from __future__ import annotations

import os

# runtime.DEVICE_VARIABLE, spelt out: importing distcourse would import torch here
os.environ["DISTCOURSE_DEVICE"] = "cpu"

"""distcourse.accelerator: the one device adapter, and the rule that keeps it the only
place that compares a device type with "cuda" (the package, book/scripts and the
notebooks' code cells), so the emulated GPU box runs the code a GPU runs."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import torch

from distcourse import accelerator, emulate

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = ROOT / "distcourse" / "accelerator.py"
emulate.setup()
GPU = torch.device(emulate.DEVICE_TYPE, 1)


def test_a_gpu_is_cudas_or_the_emulated_one() -> None:
    assert accelerator.is_gpu(torch.device("cuda", 0)) and accelerator.is_gpu(GPU)
    assert accelerator.is_gpu("gpu:3") and not accelerator.is_gpu("cpu")
    assert accelerator.is_cuda("cuda:1") and not accelerator.is_cuda(GPU)
    assert accelerator.kernel_type(GPU) == accelerator.kernel_type("cuda") == "cuda"
    assert accelerator.kernel_type("cpu") == "cpu"
    assert accelerator.ddp_device_ids(GPU) == [1]
    assert accelerator.ddp_device_ids("cpu") is None
    assert accelerator.module(GPU) is torch.get_device_module("gpu")
    assert accelerator.local_gpus(2, "emulated") == []  # one process, one device
    assert accelerator.local_gpus(2, "cpu") == []


def test_the_device_generator_state_is_saved_and_restored() -> None:
    here = torch.device(emulate.DEVICE_TYPE, 0)
    torch.manual_seed(3)
    state = accelerator.rng_state(here)
    first = torch.rand(3, device=here).cpu()
    accelerator.set_rng_state(state, here)
    assert torch.equal(torch.rand(3, device=here).cpu(), first)
    assert accelerator.rng_state("cpu") is None
    accelerator.set_rng_state(None, "cpu")  # nothing to restore


def _compares_with_cuda(source: str) -> list[int]:
    """Lines of `source` (Python) that compare something with "cuda" by == or !=."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
            isinstance(op, ast.Eq | ast.NotEq) for op in node.ops
        ):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and s.value == "cuda" for s in sides):
                found.append(node.lineno)
    return found


_MAGIC = re.compile(r"^\s*[%!].*$", re.MULTILINE)


def _sources() -> dict[str, str]:
    """Every Python source the rule covers: name -> text (a notebook's code cells
    one by one, their IPython magics blanked)."""
    files = sorted((ROOT / "distcourse").rglob("*.py"))
    files += sorted((ROOT / "book" / "scripts").rglob("*.py"))
    out = {str(p.relative_to(ROOT)): p.read_text() for p in files if p != ADAPTER}
    for nb in sorted((ROOT / "book").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                text = _MAGIC.sub("", "".join(cell["source"]))
                out[f"{nb.relative_to(ROOT)} cell {i}"] = text
    return out


def test_nothing_but_the_adapter_compares_a_device_with_cuda() -> None:
    found = {
        name: lines
        for name, text in _sources().items()
        if (lines := _compares_with_cuda(text))
    }
    assert not found, (
        f"compare through distcourse.accelerator (is_gpu, kernel_type, "
        f"ddp_device_ids, rng_state), not with 'cuda': {found}"
    )


def test_the_rule_finds_a_planted_comparison() -> None:
    """Negative control: each form the rule refuses, planted, is found."""
    planted = [
        'if device.type == "cuda":\n    pass\n',
        "ok = 'cuda' != dev.type\n",
        'ids = [d.index] if d.type == "cuda" else None\n',
    ]
    assert all(_compares_with_cuda(p) == [1] for p in planted)
    assert _compares_with_cuda('name = "cuda"\nx = y == "cpu"\n') == []

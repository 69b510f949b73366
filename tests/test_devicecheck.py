"""distcourse.devicecheck: the static check that keeps rank tensors on their device.

It must refuse the two bugs a GPU box found (chapter 2's CPU tensor sent through
NCCL, chapters 6-8b's `gt.placement("cpu", ...)`) and the module a careful read found
left on the host (chapters 10 and 12b: `DistributedDataParallel(TinyGPT(CFG))`,
`ContextGPT(TinyGPT(cfg), group)`), in a notebook rank cell and in a script, pass
their fixed versions, and pass the real book, scripts and package.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distcourse import devicecheck
from distcourse.devicecheck.sources import ROOT

SEND = "dist.send(torch.tensor([3.0]), dst=1)"
PLACEMENT = 'p = gt.placement("cpu", ranks=[0, 1])'
FIXED_SEND = "dist.send(torch.tensor([3.0], device=device), dst=1)"
FIXED_PLACEMENT = "p = gt.placement(device.type, ranks=[0, 1])"


def notebook(tmp_path: Path, *sources: str, name: str = "nb.ipynb") -> Path:
    """A notebook of code cells (a markdown cell first, so cell i is sources[i-1])."""
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# title"]}]
    cells += [
        {
            "cell_type": "code",
            "metadata": {},
            "source": s.splitlines(keepends=True),
            "outputs": [],
            "execution_count": None,
        }
        for s in sources
    ]
    path = tmp_path / name
    path.write_text(
        json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    return path


def found(path: Path) -> list[str]:
    return [str(r) for r in devicecheck.check_file(path, path.name)]


def test_a_host_tensor_sent_in_a_rank_cell_is_refused(tmp_path: Path) -> None:
    path = notebook(tmp_path, "x = 1", f"%%ranks\nif rank == 0:\n    {SEND}")
    (refusal,) = found(path)
    assert refusal.startswith("nb.ipynb:cell 2:3: dist.send() gets torch.tensor([3.0])")
    assert "device=device" in refusal


def test_a_cpu_placement_in_a_rank_cell_is_refused(tmp_path: Path) -> None:
    path = notebook(
        tmp_path, f"%%px\nimport distcourse.global_tensor as gt\n{PLACEMENT}"
    )
    assert found(path) == [
        'nb.ipynb:cell 1:3: placement("cpu", ...): a literal "cpu" where the rank\'s '
        "device is meant; pass device.type"
    ]


def test_the_same_bugs_in_a_script_are_refused(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(f"import torch.distributed as dist\n{SEND}\n{PLACEMENT}\n")
    lines = [r.split(": ", 1)[0] for r in found(script)]
    assert lines == ["train.py:2", "train.py:3"]


def test_the_fixed_versions_pass(tmp_path: Path) -> None:
    path = notebook(tmp_path, f"%%ranks\n{FIXED_SEND}\n{FIXED_PLACEMENT}")
    script = tmp_path / "train.py"
    script.write_text(
        f"{FIXED_SEND}\n{FIXED_PLACEMENT}\nt = torch.ones(2).to(device)\n"
        "dist.all_reduce(t)\n"
    )
    assert found(path) == [] and found(script) == []


@pytest.mark.parametrize(
    "code",
    [
        "got = torch.zeros(3)\ndist.recv(got, src=0)",  # a local name
        "token = torch.zeros(1)\ndist.send(token + 1, dst=1)",  # an expression of it
        "parts = [torch.empty(1) for _ in range(4)]\ndist.all_gather(parts, x)",
        "def shift(out, inc):\n    dist.isend(out, dst=1).wait()\n\n"
        "shift(torch.tensor([1.0]), None)",  # through a local function
        "import torch.distributed as d2\nd2.all_reduce(torch.ones(2))",
        "torch.distributed.broadcast(torch.arange(4.0).clone(), src=0)",
        'mesh = init_device_mesh("cpu", (4,))',
        'mesh = DeviceMesh("cpu", [0, 1])',
        'mesh = Mesh((2, 2), ("dp", "tp"), device_type="cpu")',
        'from distcourse.global_tensor import placement as where\nwhere("cpu", [0])',
        "p = gt.placement(ranks=[0, 1])",  # the default type is the CPU
        "model = TinyGPT(cfg)\nddp = DistributedDataParallel(model)",  # host module
        "model = cg.ContextGPT(TinyGPT(cfg), group)",  # built inside the call
        "block = Block(c)\nhalf = parallelize_block(block, sequence_parallel=True)",
        "m = Net()\nm = m.float()\nfully_shard(m)",  # not a move
    ],
)
def test_each_form_is_refused(tmp_path: Path, code: str) -> None:
    assert len(found(notebook(tmp_path, "%%ranks\n" + code))) == 1


@pytest.mark.parametrize(
    "code",
    [
        "dist.all_gather_object(out, torch.zeros(2))",  # objects travel pickled
        "t = torch.zeros(2)\nt = t.to(device)\ndist.all_reduce(t)",  # moved first
        "t = torch.zeros(2)  # devicecheck: host (why: explained here)\n"
        "dist.all_reduce(t)",
        "dist.all_reduce(torch.zeros(2))  # devicecheck: host",
        'mesh = Mesh((2, 2), ("dp", "tp"))',  # Mesh takes the rank's device itself
        "p = gt.placement(mesh=mesh)",  # the mesh's device type
        "model = TinyGPT(cfg).to(device)\nDDP(model)",  # moved when built
        "model = TinyGPT(cfg)\nmodel.to(device)\nDDP(model)",  # moved in place
        "DDP(nn.Linear(4, 4, device=device))",  # built there
        "DDP(ToyMpModel(dev0, dev1))",  # a model that places itself
        "DDP(nn.Sequential(first, second))",  # a container: its children's device
        "x = Net()\ny = x(inputs)",  # run, not wrapped: not this rule's to judge
    ],
)
def test_what_is_not_refused(tmp_path: Path, code: str) -> None:
    assert found(notebook(tmp_path, "%%ranks\n" + code)) == []


def test_kernel_cells_are_not_rank_code_but_spawned_functions_are(
    tmp_path: Path,
) -> None:
    reference = f"import torch\n{SEND}"  # a kernel cell: no process group there
    spawned = f"def work():\n    {SEND}\n\nspawn(work, 2)"
    path = notebook(tmp_path, reference, spawned)
    assert [r.split(": ")[0] for r in found(path)] == ["nb.ipynb:cell 2:2"]


def test_a_host_module_is_named_with_what_built_it(tmp_path: Path) -> None:
    code = "%%ranks\nmodel = TinyGPT(CFG)\nddp = DistributedDataParallel(model)"
    (refusal,) = found(notebook(tmp_path, code))
    assert refusal.startswith(
        "nb.ipynb:cell 1:3: DistributedDataParallel() gets model, a module built on "
        "the host by TinyGPT(CFG)"
    )
    assert "move it first with .to(device)" in refusal


def test_names_carry_across_rank_cells(tmp_path: Path) -> None:
    path = notebook(
        tmp_path, "%%px\ngot = torch.zeros(3)", "%%ranks\ndist.recv(got, 0)"
    )
    assert [r.split(": ")[0] for r in found(path)] == ["nb.ipynb:cell 2:2"]


def test_the_command_line_exits_1_naming_each_refusal(tmp_path: Path) -> None:
    bad = notebook(tmp_path, f"%%ranks\n{SEND}", f"%%ranks\n{PLACEMENT}")
    good = notebook(tmp_path, f"%%ranks\n{FIXED_SEND}", name="good.ipynb")
    run = [sys.executable, "-m", "distcourse.devicecheck"]
    done = subprocess.run(
        [*run, str(bad), str(good)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert [ln.split(": ")[0] for ln in done.stdout.splitlines()] == [
        "nb.ipynb:cell 1:2",
        "nb.ipynb:cell 2:2",
    ]
    fine = subprocess.run(
        [*run, str(good)], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert fine.returncode == 0 and fine.stdout == ""
    missing = subprocess.run(
        [*run, "nowhere"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert missing.returncode == 2 and "nowhere" in missing.stderr


def test_the_book_the_scripts_and_the_package_pass() -> None:
    refusals = devicecheck.check_paths()
    assert refusals == [], "\n".join(map(str, refusals))
    checked = devicecheck.sources.files(ROOT / p for p in ("book", "distcourse"))
    assert len([f for f in checked if f.suffix == ".ipynb"]) >= 10


def test_importing_the_check_does_not_import_torch() -> None:
    code = "import sys, distcourse.devicecheck; print('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.stdout.strip() == "False", done.stderr

"""Record what this machine's GPU runs, for tests/test_emulate_recorder.py to hold
the emulated GPU box to (tools/gpu_check.sh's `traces` step runs it on a GPU box).

    python tools/record_traces.py OUT [--device cuda|emulated|cpu]

Writes OUT/<program>.json for each of distcourse.emulate.recorder.PROGRAMS: the
TinyGPT autocast program in this process on the device's first GPU, and chapter 1's
DDP program on one rank (NCCL on cuda, emulated NCCL, or gloo on the CPU). Each file
names its device, torch version and date. `--device emulated` or `cpu` is the dry
run of a machine without a GPU (nothing there belongs in tests/data/gpu_traces/).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from distcourse import emulate, runtime
from distcourse.emulate import recorder
from distcourse.launch import spawn

BACKENDS = {"cuda": "nccl", "emulated": "emulated", "cpu": "gloo"}


def _device(kind: str) -> torch.device:
    if kind == "emulated":
        emulate.setup()
        return emulate.current()
    return torch.device(kind, 0) if kind != "cpu" else torch.device("cpu")


def _on_rank(program: str) -> dict:
    return recorder.record(program, runtime.device())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=sorted(BACKENDS), default="cuda")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda: torch sees no GPU here (try --device emulated)"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    traces = {
        "tinygpt-autocast": recorder.record("tinygpt-autocast", _device(args.device))
    }
    backend = BACKENDS[args.device]
    traces["ddp-digits"] = spawn(
        _on_rank, 1, "ddp-digits", backend=backend, timeout=120
    )[0]
    for program, trace in traces.items():
        path = args.out / f"{program}.json"
        path.write_text(json.dumps(trace, indent=1) + "\n")
        print(
            f"{path}: {len(trace['ops'])} ops, {len(trace['messages'])} messages "
            f"on {trace['device']} (torch {trace['torch']}, {trace['date']})"
        )


if __name__ == "__main__":
    main()

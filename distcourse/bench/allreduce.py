"""Bus bandwidth of distcourse's ring all-reduce against torch's dist.all_reduce.

`python -m distcourse.bench allreduce [--json] [--quick] [--sizes 1K 64M] [--ranks 2 4]
[--runs 5]`. Both run in the same ranks, alternating call by call, so a busy machine
slows both; the ratio of their bus bandwidths is what one run measures. A row gives the
median over --runs runs and the spread (lowest and highest ratio).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import statistics

import torch.distributed as dist

from distcourse import comm, tables
from distcourse.comm.costmodel import bus_bandwidth, measure
from distcourse.launch import spawn

DEFAULT_SIZES = [4**k * 1024 for k in range(9)]  # 1 KB .. 64 MB, float32
QUICK_SIZES = [1024, 64 * 1024]
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int:
    """'64M', '1K', '4096' or '16MB' to a number of bytes."""
    match = re.fullmatch(r"(\d+)\s*([KMG]?)B?", text.strip().upper())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 1K, 16M)")
    return int(match[1]) * _UNITS[match[2]]


def _on_rank(
    sizes: list[int], repeats: int, warmup: int, runs: int
) -> list[dict[str, list[float]]]:
    """Time both all-reduces on every size, `runs` times; runs on each rank."""
    ring = functools.partial(comm.ring_all_reduce, check=False)
    fns = {"torch": dist.all_reduce, "distcourse": ring}
    return [measure(fns, sizes, repeats=repeats, warmup=warmup) for _ in range(runs)]


def run(
    ranks: list[int], sizes: list[int], repeats: int, warmup: int, runs: int = 1
) -> list[dict]:
    """One table row per (ranks, size): bus bandwidths in GB/s and their ratio, the
    medians over `runs` runs, with the lowest and highest ratio of a run."""
    rows = []
    for n in ranks:
        per_run = spawn(_on_rank, n, sizes, repeats, warmup, runs, timeout=600)[0]
        for i, size in enumerate(sizes):
            bw = {
                name: [bus_bandwidth(size, n, t[name][i]) / 1e9 for t in per_run]
                for name in ("torch", "distcourse")
            }
            torch_bw, ours_bw = bw["torch"], bw["distcourse"]
            ratios = [a / b for a, b in zip(ours_bw, torch_bw, strict=True)]
            rows.append(
                dict(
                    ranks=n,
                    bytes=size,
                    torch_gbps=statistics.median(torch_bw),
                    distcourse_gbps=statistics.median(ours_bw),
                    ratio=statistics.median(ratios),
                    ratio_min=min(ratios),
                    ratio_max=max(ratios),
                    runs=len(ratios),
                )
            )
    return rows


def _human(size: int) -> str:
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}B"
    return f"{size} B"


def table(rows: list[dict]) -> str:
    """The rows as a fixed-width text table (ratio: median; spread: lowest-highest)."""
    head = ("ranks", "size", "torch GB/s", "distcourse GB/s", "ratio", "spread", "runs")
    cells = [
        (
            r["ranks"],
            _human(r["bytes"]),
            f"{r['torch_gbps']:.3f}",
            f"{r['distcourse_gbps']:.3f}",
            f"{r['ratio']:.2f}",
            f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}",
            r["runs"],
        )
        for r in rows
    ]
    return tables.aligned(
        [head, *cells], widths=(5, 8, 11, 16, 6, 10, 4), align=">" * 7
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m distcourse.bench allreduce")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="two small sizes, 1 run")
    parser.add_argument("--sizes", nargs="+", type=parse_size, help="e.g. 1K 16M")
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--repeats", type=int, default=9, help="timed calls a run")
    parser.add_argument("--runs", type=int, default=5, help="runs: median, spread")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.repeats < 1:
        parser.error("--runs and --repeats must be at least 1")
    sizes = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    repeats, warmup, runs = (1, 0, 1) if args.quick else (args.repeats, 2, args.runs)
    rows = run(args.ranks, sizes, repeats, warmup, runs)
    # the headline: the largest size on the largest world size measured
    top = max(rows, key=lambda r: (r["ranks"], r["bytes"]))
    if args.json:
        keys = ("ratio", "ratio_min", "ratio_max", "runs", "ranks", "bytes")
        headline = {key: top[key] for key in keys}
        print(json.dumps(headline | {"rows": rows}))
    else:
        print(table(rows))
        print(
            f"ratio (distcourse / torch bus bandwidth, {top['ranks']} ranks, "
            f"{_human(top['bytes'])}): {top['ratio']:.2f}, median of {top['runs']} "
            f"runs ({top['ratio_min']:.2f}-{top['ratio_max']:.2f})"
        )
    return 0

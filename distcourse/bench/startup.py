"""`python -m distcourse.bench startup`: how long notebook ranks take to be ready.

Times `cluster.start(N)` (engines up with torch imported, then the process group) and,
for comparison, ipyparallel's stock start-up with ipyparallel's defaults: engines as
separate `ipengine` processes, torch imported on each, a group joined through a TCP
rendezvous on a free port.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

from distcourse.launch import cluster
from distcourse.launch.script import free_port


def stock(n: int) -> dict[str, float]:
    """ipyparallel's defaults, the way a first notebook would do it."""
    import ipyparallel as ipp

    t0 = time.perf_counter()
    c = ipp.Cluster(n=n, log_level=logging.ERROR)
    c.start_cluster_sync()
    rc = c.connect_client_sync()
    rc.wait_for_engines(n, interactive=False)
    t1 = time.perf_counter()
    view = rc[:]
    view.execute("import torch, torch.distributed as dist", block=True)
    t2 = time.perf_counter()
    port = free_port()  # below the ephemeral range: gloo cannot take it meanwhile
    for r, e in enumerate(sorted(rc.ids)):
        rc[e].push(dict(rank=r), block=True)
    view.execute(
        "import datetime; dist.init_process_group('gloo', "
        f"init_method='tcp://127.0.0.1:{port}', rank=rank, world_size={n}, "
        "timeout=datetime.timedelta(seconds=30))",
        block=True,
    )
    t3 = time.perf_counter()
    rc.close()
    c.stop_cluster_sync()
    return {
        "engines": t1 - t0,
        "torch import": t2 - t1,
        "process group": t3 - t2,
        "total": t3 - t0,
    }


def ours(n: int) -> dict[str, float]:
    ranks = cluster.start(n, activate=False)
    timings = dict(ranks.timings)
    ranks.stop()
    return timings


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m distcourse.bench startup")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--stock", action="store_true", help="also time the defaults")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    runs = [ours(args.ranks) for _ in range(args.repeats)]
    breakdown = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    report = {"benchmark": "startup", "ranks": args.ranks, "breakdown": breakdown}
    if args.stock:
        base = [stock(args.ranks) for _ in range(args.repeats)]
        report["stock"] = {k: statistics.median(r[k] for r in base) for k in base[0]}
        report["ratio"] = breakdown["total"] / report["stock"]["total"]
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{args.ranks} ranks ready (median of {args.repeats}):")
    for name, value in breakdown.items():
        print(f"  distcourse  {name:<14} {value:6.2f} s")
    for name, value in report.get("stock", {}).items():
        print(f"  stock ipp   {name:<14} {value:6.2f} s")
    if "ratio" in report:
        print(f"  ratio distcourse/stock total: {report['ratio']:.2f}")
    return 0

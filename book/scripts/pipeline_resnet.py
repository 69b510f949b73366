"""Chapter 5's experiment: PyTorch's model-parallel tutorial, a ResNet split over two
ranks, naive and pipelined, with the tutorial's split-size sweep.

torchrun --nproc-per-node 2 book/scripts/pipeline_resnet.py           # full sizes
torchrun --nproc-per-node 2 book/scripts/pipeline_resnet.py --small   # seconds, CPU
    ... --json: rank 0 ends with one JSON line (the notebook plots it)
    ... --repeats 5: each row the median of 5 timed runs (a stored run's setting)
    ... --cut layer2: the tutorial's cut, after layer2, for every split
    ... --splits 8: only these split sizes (the naive split always runs first)

The tutorial trains 3 batches of 120 random 128x128 images, 1000 classes, MSE on
one-hot labels, SGD (lr 0.001), and reports: one GPU 3.75 s, model parallel 4.02 s,
pipelined with split size 20 2.51 s, best split 12 2.43 s. Here each half is a rank
(on a CPU box one core each: one process cannot run two halves at once on CPU), and
the micro-batches follow GPipe's schedule: split size s gives m = batch / s
micro-batches; m = 1 (the whole batch) is the naive split. Full sizes are meant for
a GPU box; --small runs a one-block-per-layer ResNet on 128x128 images, 32 to a
batch, splits 4, 8 and 16.

The model is a sequence of its stem (conv1, bn1, relu, maxpool), its residual
blocks and its head (avgpool, flatten, fc), so a cut may fall between any two of
them. The tutorial cuts after layer2; its two halves then differ in time (the stem
on full-size images costs as much as the last three layers together), and a
pipeline runs at the pace of its slower stage. So by default each split is cut where
its stages are balanced by measurement: rank 0 times every piece's forward and
backward on that split's micro-batch (`pp.layer_times`, device time), the cut that
minimises the slower stage is chosen (`pp.balance`) and sent to rank 1. Each
timing follows one untimed step: a process's first step pays one-off costs (lazy
imports, allocator warm-up) that would otherwise land on whichever row ran first.
Times are device time (clock.DeviceTimer), the slowest rank's.

Each row also gives, per stage, the milliseconds of compute (forward + backward)
per micro-batch, from the runner's events of the last timed step: the notebook
shows how balanced each cut ran, and fits fixed + per-image costs.
"""

import argparse
import json
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

from distcourse import runtime
from distcourse.clock import DeviceTimer
from distcourse.parallel import pipeline as pp
from distcourse.parallel.pipeline.split import balance

parser = argparse.ArgumentParser()
parser.add_argument("--small", action="store_true", help="a small ResNet, 128x128")
parser.add_argument("--repeats", type=int, default=1, help="median of this many runs")
parser.add_argument("--cut", choices=("balanced", "layer2"), default="balanced")
parser.add_argument("--splits", type=int, nargs="+", help="split sizes (default: all)")
parser.add_argument("--json", action="store_true", help="then a JSON line")
args = parser.parse_args()
if args.small:
    blocks, layers, classes, image, batch = BasicBlock, [1, 1, 1, 1], 10, 128, 32
    sweep = [4, 8, 16]  # BatchNorm needs 2 samples at layer4's 4x4
else:  # the tutorial's sizes
    blocks, layers, classes, image, batch = Bottleneck, [3, 4, 6, 3], 1000, 128, 120
    sweep = [1, 3, 5, 8, 10, 12, 20, 40, 60]
sweep = args.splits or sweep
BATCHES = 3

info = runtime.init_from_env(timeout=300)
dev = info.device
timer = DeviceTimer(dev)


def resnet() -> nn.Sequential:
    """The ResNet as stem, residual blocks, head: the pieces a cut falls between."""
    torch.manual_seed(0)
    r = ResNet(blocks, layers, num_classes=classes)
    stem = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool)
    body = [
        block for layer in (r.layer1, r.layer2, r.layer3, r.layer4) for block in layer
    ]
    head = nn.Sequential(r.avgpool, nn.Flatten(), r.fc)
    return nn.Sequential(stem, *body, head)


LAYER2 = 1 + sum(layers[:2])  # the tutorial's cut: after the stem, layer1, layer2


def data() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, 3, image, image, device=dev)
    labels = torch.randint(0, classes, (batch,), device=dev)
    return x, F.one_hot(labels, classes).float()


def cut_for(split: int) -> int:
    """Where stage 1 begins: balanced on rank 0's measured times of `split` images
    (every rank gets rank 0's answer), or the tutorial's."""
    if args.cut == "layer2" or split == batch:  # naive: the cut does not matter
        return LAYER2
    found = [LAYER2]
    if info.rank == 0:
        sample = torch.randn(split, 3, image, image, device=dev)
        times = pp.layer_times(resnet().to(dev), sample, repeats=2)
        found = [balance(times, 2)[1]]
    dist.broadcast_object_list(found, src=0)
    return found[0]


def train(step, params) -> float:  # noqa: ANN001
    """Seconds for BATCHES training steps (slowest rank), median of --repeats."""
    runs = []
    optimizer = torch.optim.SGD(params, lr=0.001)
    step(*data())  # untimed: one-off costs of a first step
    optimizer.zero_grad()
    for _ in range(args.repeats):
        dist.barrier()
        start = timer.stamp()
        for _ in range(BATCHES):
            optimizer.zero_grad()
            step(*data())
            optimizer.step()
        took = torch.tensor([timer.seconds(start, timer.stamp())], device=dev)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        runs.append(took.item())
    return statistics.median(runs)


# one process: rank 0 trains the whole model while rank 1 waits at the barrier
single = resnet().to(dev)
one = 0.0
if info.rank == 0:
    opt = torch.optim.SGD(single.parameters(), lr=0.001)
    F.mse_loss(single(data()[0]), data()[1]).backward()  # untimed, as in train()
    opt.zero_grad()
    start = timer.stamp()
    for _ in range(BATCHES):
        opt.zero_grad()
        x, y = data()
        F.mse_loss(single(x), y).backward()
        opt.step()
    one = timer.seconds(start, timer.stamp())
dist.barrier()

rows = []
for split in [batch, *sweep]:  # the whole batch first: the naive split
    cut = cut_for(split)
    pieces = len(resnet())
    stages = [s.to(dev) for s in pp.split_at(resnet(), [0, cut, pieces])]
    pipe = pp.Pipeline(stages, pp.gpipe(2, batch // split), F.mse_loss, timeout=300)
    mine = [p for s in pipe.local.values() for p in s.parameters()]
    took = train(pipe.step, mine)
    busy = sum(e.end - e.start for e in pipe.events)  # the last step's compute
    per_micro = torch.tensor([1000 * busy / (batch // split)], device=dev)
    stage_ms = [torch.zeros_like(per_micro) for _ in range(2)]
    dist.all_gather(stage_ms, per_micro)  # rank r holds stage r
    rows.append((split, batch // split, took, [t.item() for t in stage_ms], cut))
    pipe.close()

if info.rank == 0:
    naive = rows[0][2]
    print(
        f"ResNet {'small' if args.small else '50'}: {BATCHES} batches of {batch} "
        f"images {image}x{image}, {classes} classes, on {dev.type}"
    )
    print(f"one process {one:.2f} s")
    head = ("split", "m", "cut", "seconds", "vs naive", "stage 0 ms", "stage 1 ms")
    widths = (5, 4, 4, 8, 8, 10, 10)
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    for split, m, t, (ms0, ms1), cut in rows:  # ms: compute per micro-batch
        print(
            f"{split:>5} {m:>4} {cut:>4} {t:>8.2f} {naive / t:>7.2f}x "
            f"{ms0:>10.1f} {ms1:>10.1f}"
        )
    best = min(rows[1:], key=lambda r: r[2])
    print(f"best split size {best[0]}: {naive / best[2]:.2f}x the naive split")
if info.rank == 0 and args.json:  # last: the line the notebook reads
    shape = dict(small=args.small, batches=BATCHES, batch=batch, image=image)
    shape.update(repeats=args.repeats, cut=args.cut, pieces=len(resnet()))
    print(json.dumps(dict(shape, one=one, rows=rows)))
runtime.shutdown()

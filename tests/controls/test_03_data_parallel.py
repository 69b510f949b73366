"""Negative controls of chapter 3: its own cells (the loop by hand, TinyDDP, our
DDP and torch's, trained for one epoch of digits on 4 ranks and checked against
each other and one process; the bytes handed to all-reduce and sent on the wire;
the sampler's shares), run with a fault planted, must turn each verdict they print
from PASS to FAIL.

The faults: the averaging line left out; average_gradients summing, or leaving out
the last parameter; TinyDDP without its division; our DDP or torch's summing (a
comm hook without the division, tests/controls/ddp_faults.py), or with a frozen
bias in no bucket; the ledger's receives counted as sent; each rank's sampler
seeded apart. The overlap verdict, judged on a stored run, is checked on a DDP
that puts every gradient in one bucket. Lines as written: the stored notebook's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ddp_faults
import harness
import pytest
import torch
import torch.distributed as dist
from harness import Code, Fault, Plant, Swap
from torch.nn.parallel import DistributedDataParallel

from distcourse import trace
from distcourse.bench import overlap
from distcourse.parallel import ddp

CHAPTER = harness.Chapter(
    "03_data_parallel", setup=["share = partition(train_set)"], stored=True
)
TRAINED = [  # every model the chapter trains, and the check against one process
    "def global_mean(",
    "class TinyDDP(",
    "def train_share(",
    "tiny, tiny_losses = train_share(",
    "ours, ours_losses = train_share(",
    "def one_process()",
]
BYTES = [  # the bytes each way hands to all-reduce, and each algorithm's wire bytes
    "def first_two_steps(",
    "def handed(",
    "measured = {name: handed(*fns)",
    Code(  # cell 24's model after training: only its gradients' sizes are counted
        "%%ranks\nours = models.digits_mlp()\n"
        "for p in ours.parameters():\n    p.grad = torch.ones_like(p)\n"
    ),
    "for name, algorithm in {",
]


def summed_gradients(model: torch.nn.Module) -> None:
    """average_gradients without its division: gradients summed over the ranks."""
    for p in model.parameters():
        dist.all_reduce(p.grad)


def all_but_the_last(model: torch.nn.Module) -> None:
    """average_gradients over every parameter but the last: one left out."""
    for p in list(model.parameters())[:-1]:
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


class SummingTorchDDP(DistributedDataParallel):
    """torch's DDP with `summed_hook` registered: it sums the ranks' gradients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register_comm_hook(None, ddp_faults.summed_hook)


class FrozenOurs(ddp.DDP):
    """Our DDP of a model whose first bias is frozen: a parameter in no bucket."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        module[1].bias.requires_grad_(False)
        super().__init__(module, *args, **kwargs)


class FrozenTorchs(DistributedDataParallel):
    """torch's DDP of a model whose first bias is frozen: a parameter in no bucket."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        module[1].bias.requires_grad_(False)
        super().__init__(module, *args, **kwargs)


TORCH_DDP = (torch.nn.parallel, "DistributedDataParallel")
TINY_SUMMING = Swap(
    "        p.grad /= world_size  # summing grad / N over the ranks gives the average",
    "",
)
SUMMING = (  # each way of the four summing the ranks' gradients
    Plant(ddp, "average_gradients", summed_gradients),
    TINY_SUMMING,
    Plant(ddp, "DDP", ddp_faults.SummingDDP),
    Plant(*TORCH_DDP, SummingTorchDDP),
)
FAULTS = {
    "no averaging": Fault(
        ["def global_mean("],
        Swap(
            "    average_gradients(model)  # the line that makes it data parallel", ""
        ),
    ),
    "TinyDDP summing": Fault(TRAINED[:4], TINY_SUMMING),
    "our DDP summing": Fault(
        ["def global_mean(", "def train_share(", "ours, ours_losses = train_share("],
        Plant(ddp, "DDP", ddp_faults.SummingDDP),
    ),
    "every way summing": Fault(TRAINED, *SUMMING),
    "one left out": Fault(BYTES, Plant(ddp, "average_gradients", all_but_the_last)),
    "frozen bias": Fault(
        BYTES, Plant(ddp, "DDP", FrozenOurs), Plant(*TORCH_DDP, FrozenTorchs)
    ),
    "receives counted": Fault(
        BYTES,
        Swap(
            '    sent = sum(r.bytes for r in ledger.records if r.kind == "send")  '
            "# point-to-point",
            "    sent = sum(r.bytes for r in ledger.records)",
        ),
    ),
    "samplers seeded apart": Fault(
        ["forgot = DistributedSampler("],
        Swap(
            "right = DistributedSampler(train_set, world_size, rank, shuffle=True, "
            "seed=0)",
            "right = DistributedSampler(train_set, world_size, rank, shuffle=True, "
            "seed=rank)",
        ),
    ),
}


CONTROLS = harness.Controls(
    "03_data_parallel",
    test_replicas_without_averaging_are_not_identical=harness.Flip(
        ["no averaging"],
        r"after \d+ steps, parameters identical on all ranks: True",
        "the averaging left out: each rank steps on its own gradient",
    ),
    test_a_tinyddp_that_sums_is_not_the_loop_by_hand=harness.Flip(
        ["TinyDDP summing"],
        r"TinyDDP and by hand: parameters bit for bit identical on every rank: True",
        "TinyDDP without its division by the world size: gradients summed",
    ),
    test_our_ddp_summing_is_not_torchs=harness.Flip(
        ["our DDP summing"],
        r"max \|loss difference\| over \d+ steps <= 1e-06: PASS",
        "our DDP with a comm hook that sums the buckets instead of averaging",
    ),
    # Each row trains its own model: one run with the four summing fails each.
    test_summed_gradients_are_not_one_process=harness.Flip(
        ["every way summing"],
        r"by hand\s+max \|4 ranks - one process\|",
        "the loop by hand sums the gradients (all_reduce without / N)",
        r"TinyDDP\s+max \|4 ranks - one process\|",
        "TinyDDP without its division by the world size: gradients summed",
        r"our DDP\s+max \|4 ranks - one process\|",
        "our DDP with a comm hook that sums the buckets instead of averaging",
        r"torch DDP\s+max \|4 ranks - one process\|",
        "torch's DDP with a comm hook that sums the buckets instead of averaging",
    ),
    test_the_loop_by_hand_leaving_one_out_is_not_all_of_s=harness.Flip(
        ["one left out"],
        r"by hand\s+all-reduces: .*in all S: True",
        "the loop by hand averages every parameter but the last",
    ),
    test_a_parameter_in_no_bucket_is_not_all_of_s=harness.Flip(
        ["frozen bias"],
        r"our DDP\s+all-reduces: .*in all S: True",
        "a parameter in no bucket (the first bias frozen)",
        r"torch DDP\s+all-reduces: .*in all S: True",
        "a parameter in no bucket (the first bias frozen)",
    ),
    test_bytes_counted_with_the_receives_are_not_the_formula=harness.Flip(
        ["receives counted"],
        r"ring:\s+ranks sent .*: True",
        "the ledger's receives counted as sent bytes too",
        r"naive: the root sent .*: True",
        "the ledger's receives counted as sent bytes too",
    ),
    test_samplers_seeded_apart_do_not_share_the_data=harness.Flip(
        ["samplers seeded apart"],
        r"shares are disjoint and cover all [\d,]+ images: True",
        "each rank's sampler with a seed of its own (seed=rank)",
    ),
)
globals().update(CONTROLS.tests())


class OneBucketDDP(ddp.DDP):
    """Our DDP with every gradient in one bucket whatever the cap: the DDP that
    sends after backward (its one all-reduce starts at the last gradient)."""

    def __init__(self, module: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["bucket_cap_mb"] = 1e6
        super().__init__(module, *args, **kwargs)


@pytest.mark.controls(
    "03_data_parallel",
    r"best bucket size \S+ MB: median hidden share .* at least 0\.5",
    fault="a DDP that puts every gradient in one bucket (it sends after backward), "
    "measured on 2 ranks; a run stored under load",
)
def test_a_ddp_that_sends_after_backward_fails(stored_flips: Callable) -> None:
    data = overlap.measure(overlap.QUICK, OneBucketDDP)
    assert set(data["buckets"].values()) == {1}
    stored_flips(overlap.verdict, overlap.NAME, data)
    after = [  # five buckets, every one launched after the last gradient
        ("forward", 0.0, 1.0),
        ("backward", 1.0, 4.0),
        *((f"all_reduce {i}", 4.0 + i, 4.5 + i) for i in range(5)),
    ]
    queued = [  # launched during backward, served only after it
        ("backward", 1.0, 4.0),
        *((f"all_reduce {i}", 1.5 + 0.5 * i, 4.2 + i) for i in range(5)),
    ]
    assert [trace.hidden_fraction(t) for t in (after, queued)] == [0.0, 0.0]
    served = [("backward", 1.0, 4.0), ("all_reduce 0", 1.5, 3.0)]  # the real thing
    assert trace.hidden_fraction(served) == 1.0

"""Negative controls for chapter 13's verdicts: the same checks, on planted faults.

The chapter's own cells run on the harness (tests/controls/harness.py: one spawn of
its 4 ranks; the lines as written are the stored notebook's, which nbval holds),
each with a fault planted in the code it checks:

- the trainer refusing a pair of flags it composes (FSDP with a pipeline, as it
  once did), and the sampler giving every data-parallel rank the first rows;
- `cli.compare` with TP's f missing its backward all-reduce (`edges.f` the
  identity: Megatron's f, forgotten), with the gradients averaged over dp in bf16
  where float32 is asked, and summed over dp, not averaged;
- the run with its schedule stuck at 0 (it never steps: it learns nothing);
- the run with TP silently off (every rank keeps whole matrices): its memory.

The kill drill's verdicts run the script under torchrun with the kill disarmed
(`fault.kill_in_forward` a no-op, planted in a copy of the script), and the resumes
(killed and resumed, and on another layout) in process, shorter, with AdamW's
moments left out of the checkpoint's load.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import harness
import pytest
import torch
import torch.distributed as dist
from harness import Fault, Plant

from distcourse import checks
from distcourse.launch import spawn
from distcourse.launch.script import run_torchrun
from distcourse.parallel.hybrid import HybridGPT, runner
from distcourse.parallel.tensor import edges
from distcourse.train import Corpus, RunConfig, Sampler, Trainer, TrainLayout
from distcourse.train import checkpoint as train_checkpoint
from distcourse.train import layout as train_layout
from distcourse.train import trainer as train_trainer

CHAPTER = harness.Chapter("13_trainer", stored=True, timeout=120)
FIRST = "corpus = Corpus.excerpt()  # the book's first 65,536 characters"
COMPOSE = [FIRST, "every_combination(8, cfg, run.batch)"]
SAMPLER = [
    FIRST,
    "bpe = tokens.build(",
    "4 data-parallel ranks read one process's batch",
]
COMPARE = ["for line in cli.compare(LAYOUT, replace(run, steps=3), corpus):"]
BF16 = [*COMPARE, 'sgd = replace(run, steps=2, optimizer="sgd", lr=0.5)']
RUN = [*COMPARE, "LOSSES = trainer.fit()", "below = EVALS[64] < unigram"]
MEMORY = [*RUN, "every rank's measured peak within 15 % of the plan"]


def refusing_fsdp_with_a_pipeline(real: Callable) -> Callable:
    def refuse(layout: train_layout.TrainLayout) -> None:
        real(layout)
        if layout.data_mode == "fsdp" and layout.pp > 1:
            raise ValueError(f"--fsdp with --pp {layout.pp}: not composed")

    return refuse


def bf16_average(self: HybridGPT) -> None:
    """The dp all-reduce in bf16: each gradient / dp cast down, summed, cast up."""
    for p in self.module.parameters():
        g = (p.grad / self.layout.dp).to(torch.bfloat16)
        dist.all_reduce(g, group=self.mesh.group("dp"))
        p.grad.copy_(g.float())


def summed(real: Callable) -> Callable:
    def average_gradients(self: HybridGPT) -> None:
        real(self)
        for p in self.module.parameters():
            p.grad.mul_(self.layout.dp)

    return average_gradients


FAULTS = {
    "refused": Fault(
        COMPOSE,
        Plant(train_layout, "refuse_pairs", refusing_fsdp_with_a_pipeline, wrap=True),
    ),
    "first rows": Fault(
        SAMPLER,
        Plant(Sampler, "rows", property(lambda self: slice(0, self.batch // self.dp))),
    ),
    "tp f": Fault(BF16, Plant(edges, "f", lambda x, group: x)),
    "bf16 reduce": Fault(BF16, Plant(HybridGPT, "average_gradients", bf16_average)),
    "summed": Fault(BF16, Plant(HybridGPT, "average_gradients", summed, wrap=True)),
    "stuck": Fault(RUN, Plant(train_trainer, "lr_factor", lambda run: lambda s: 0.0)),
    "tp off": Fault(
        MEMORY,
        Plant(runner, "parallelize_stage", lambda stage, group, check=True: stage),
    ),
}


CONTROLS = harness.Controls(
    "13_trainer",
    test_a_refused_composition_is_seen=harness.Flip(
        ["refused"],
        r"every refusal is the model's shape, not a pair of flags",
        "the trainer refuses FSDP with a pipeline, as it once did",
    ),
    test_ranks_that_read_the_same_rows_are_seen=harness.Flip(
        ["first rows"],
        r"4 data-parallel ranks read one process's batch, row for row",
        "the sampler gives every data-parallel rank the batch's first rows",
    ),
    test_compare_with_tp_missing_its_backward_all_reduce_fails=harness.Flip(
        ["tp f"],
        r"1x2x2 m2 1f1b( bf16)?: (gradients of step 1|losses of \d (sgd|adamw) steps"
        r"|parameters after \d sgd steps) vs one process",
        "TP's f without its backward all-reduce (edges.f the identity)",
    ),
    test_a_bf16_reduce_fails_the_bf16_check=harness.Flip(
        ["bf16 reduce"],
        r"4x1x1 bf16: gradients of step 1 vs one process",
        "the gradients averaged over dp in bf16 where float32 is asked",
    ),
    test_gradients_summed_over_dp_fail_the_bf16_losses=harness.Flip(
        ["summed"],
        r"4x1x1 bf16: (losses of 2 sgd steps|parameters after 2 sgd steps) vs one",
        "the gradients summed over dp, not averaged (x 4)",
    ),
    test_a_run_that_never_steps_learns_nothing=harness.Flip(
        ["stuck"],
        r"held-out loss at step 64 below what frequencies alone reach",
        "the schedule stuck at 0: the rate never rises, nothing is learned",
    ),
    test_a_run_that_does_not_split_holds_more_than_its_plan=harness.Flip(
        ["tp off"],
        r"every rank's measured peak within 15 % of the plan",
        "TP silently off: every rank keeps whole matrices (no parallelize_stage)",
    ),
)
globals().update(CONTROLS.tests())


# ----------------------------------------------------------- the kill drill --

CORPUS = Corpus.excerpt()
SHORT = RunConfig(steps=8, batch=16, seq=32, lr=3e-2, warmup=4, min_lr=1.0, quiet=True)
LAYOUT = TrainLayout(dp=1, pp=2, tp=2, micro_batches=2)


def without_moments(real: Callable) -> Callable:
    """checkpoint.load that leaves AdamW's moments out (they restart at zero)."""

    def load(path: object, net: HybridGPT) -> object:
        snap = real(path, net)
        net.optimizer.state.clear()
        return snap

    return load


def _resumed(work: str) -> dict[str, float]:
    """The chapter's two resume checks, shorter: saved after 4 steps on 1x2x2,
    resumed with AdamW's moments left out on the same layout and on 4x1x1, each
    against the uninterrupted run's losses of steps 5-8."""
    torch.set_num_threads(1)
    whole = Trainer(LAYOUT, SHORT, CORPUS)
    straight = whole.fit()
    whole.close()
    found = {}
    for name, other in (("same", LAYOUT), ("other", TrainLayout(dp=4))):
        folder = [f"{work}/{name}" if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(folder)
        run = replace(SHORT, ckpt_dir=folder[0])
        first = Trainer(LAYOUT, run, CORPUS)
        first.fit(until=4)
        first.save()
        first.close()
        with harness.planted([Plant(train_checkpoint, "load", without_moments, True)]):
            second = Trainer(other, run, CORPUS)
        losses = second.fit()
        second.close()
        pairs = zip(losses[4:], straight[4:], strict=True)
        found[name] = max(abs(a - b) for a, b in pairs)
    return found


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    work = str(tmp_path_factory.mktemp("ch13-resume"))
    return spawn(_resumed, 4, work, timeout=120)[0]


@pytest.mark.controls(
    "13_trainer",
    r"losses of steps 1-12, killed and resumed vs uninterrupted",
    fault="the resume leaves AdamW's moments out (checkpoint.load drops them)",
)
@pytest.mark.controls(
    "13_trainer",
    r"losses of steps 13-16 on 2 ranks vs 4",
    fault="the resume on another layout leaves AdamW's moments out",
)
def test_a_resume_without_adams_moments_fails_on_either_layout(
    resumed: dict,
) -> None:
    """One fault, both verdicts: the same layout (4 ranks) and another (2)."""
    assert checks.verdict(resumed["same"], 1e-6).endswith("FAIL"), resumed
    assert checks.verdict(resumed["other"], 1e-5).endswith("FAIL"), resumed


@pytest.mark.controls(
    "13_trainer",
    r"torchrun saw rank 1 die by SIGKILL and restarted the group",
    fault="the kill disarmed (fault.kill_in_forward a no-op): no rank dies",
)
def test_a_drill_whose_rank_does_not_die_is_seen(tmp_path: Path) -> None:
    script = tmp_path / "train_gpt_disarmed.py"
    script.write_text(
        "from distcourse.train import cli, fault\n"
        "fault.kill_in_forward = lambda module: None  # the planted fault\n"
        "cli.main()\n"
    )
    small = ["--layers", "2", "--batch", "4", "--seq", "16", "--quiet", "--excerpt"]
    drill = run_torchrun(
        script,
        *small,
        *("--pp", "2", "--micro-batches", "2", "--steps", "4", "--ckpt-every", "2"),
        *("--ckpt-dir", str(tmp_path / "ckpt"), "--kill", "1:3"),
        ranks=2,
        max_restarts=1,
        env={"DISTCOURSE_DEVICE": "cpu"},
    )
    died = re.search(r"exitcode: -9\) local_rank: 1\b", drill.stderr) is not None
    assert died is False
    assert "steps 1-4" in drill.stdout  # one attempt, nothing restarted

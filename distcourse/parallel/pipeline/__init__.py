"""Pipeline parallelism: cut a sequential model into stages on neighbouring ranks.

    stages = split_by_count(model, 4)          # same on every rank
    pipe = Pipeline(stages, one_f_one_b(4, 8), F.mse_loss)
    loss = pipe.step(x, y)                     # x on stage 0's rank, y on the last's

split: where to cut; schedules: GPipe, 1F1B, interleaved 1F1B as lists of actions;
zero_bubble: ZB-H1, its backward split into input (B) and weight (W) gradients;
plain: PlainPipeline, a schedule run plainly (receive, run, send: read it first);
runner: Pipeline, the same with checks, events and transfers posted ahead; batch:
each step's batch agreed by all ranks; links: the groups (and threads) that carry
the transfers; shapes: each stage's input checked before any send; stats: activation
memory held and the bubble measured from the events.
"""

from distcourse.parallel.pipeline.plain import PlainPipeline
from distcourse.parallel.pipeline.runner import Pipeline
from distcourse.parallel.pipeline.schedules import (
    Action,
    Schedule,
    bubble_formula,
    check,
    gpipe,
    in_flight,
    interleaved,
    one_f_one_b,
    simulate,
    transfers,
)
from distcourse.parallel.pipeline.split import (
    balance,
    layer_times,
    split_at,
    split_balanced,
    split_by_count,
)
from distcourse.parallel.pipeline.stats import (
    ActivationMeter,
    StageTimer,
    bubble,
    efficiency,
    extra_per_micro_batch,
    held_as_predicted,
    ideal_step,
    micro_batch_cost,
    parse,
    stage_times,
)
from distcourse.parallel.pipeline.zero_bubble import backward_input, zb_h1, zb_h1_bubble

__all__ = [
    "Action",
    "ActivationMeter",
    "Pipeline",
    "PlainPipeline",
    "Schedule",
    "StageTimer",
    "balance",
    "bubble",
    "bubble_formula",
    "check",
    "efficiency",
    "extra_per_micro_batch",
    "held_as_predicted",
    "ideal_step",
    "gpipe",
    "in_flight",
    "interleaved",
    "micro_batch_cost",
    "layer_times",
    "one_f_one_b",
    "parse",
    "simulate",
    "split_at",
    "split_balanced",
    "split_by_count",
    "stage_times",
    "transfers",
    "backward_input",
    "zb_h1",
    "zb_h1_bubble",
]

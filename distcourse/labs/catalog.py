"""The labs, each a Lab: the broken program, the function to fix, and a hint.

`LABS` lists them in the chapter's order: four that hang or crash (the ranks' calls
part), then four that finish with wrong numbers (found by comparing).
"""

from __future__ import annotations

from distcourse.labs import hangs, silent
from distcourse.labs.lab import Lab

SKIPPED_COLLECTIVE = Lab(
    name="skipped_collective",
    title="a collective one rank skips",
    world=2,
    program=hangs.logging_program,
    broken=hangs.log_loss_broken,
    signature="log_loss(loss, rank, world) -> float",
    compare=hangs.logging_compare,
    hint="every rank must call every collective, the same number of times: "
    "all-reduce the loss on all ranks, then divide by world, even if only rank 0 "
    "prints it",
)
COLLECTIVE_ORDER = Lab(
    name="collective_order",
    title="ranks calling collectives in a different order",
    world=4,
    program=hangs.ready_program,
    broken=hangs.sync_grads_broken,
    signature="sync_grads(grads, world) -> None",
    compare=hangs.ready_compare,
    hint="collectives pair up by their order on each rank, not by name: iterate "
    "the gradients in an order every rank shares (sorted by name), and average "
    "(divide by world) after the sum",
)
PIPELINE_MICROBATCHES = Lab(
    name="pipeline_microbatches",
    title="a pipeline with fewer micro-batches than stages",
    world=4,
    program=hangs.pipeline_program,
    broken=hangs.warmup_broken,
    signature="warmup(stage, stages, micro_batches) -> int",
    compare=hangs.pipeline_compare,
    hint="a stage cannot run more warm-up forwards than there are micro-batches: "
    "cap the count at micro_batches (stages - stage - 1 when there are enough)",
)
UNEVEN_GATHER = Lab(
    name="uneven_gather",
    title="an all_gather whose sizes differ across ranks",
    world=2,
    program=hangs.gather_program,
    broken=hangs.gather_broken,
    signature="gather(preds, world) -> Tensor",
    compare=hangs.gather_compare,
    hint="all_gather needs the same shape on every rank: all-gather the sizes "
    "first, pad each piece to the largest, gather, then cut each piece back to "
    "its own size",
)
DROPOUT_SEED = Lab(
    name="dropout_seed",
    title="a dropout seed that differs across tensor-parallel ranks",
    world=2,
    program=silent.dropout_program,
    broken=silent.dropout_seed_broken,
    signature="dropout_seed(seed, tp_rank, tp_size) -> int",
    compare=silent.dropout_compare,
    hint="after the all-reduce every tensor-parallel rank holds the same tensor, "
    "so its dropout mask must be the same too: seed every rank of the group "
    "alike, with the seed one process uses",
)
LAYERNORM_SP = Lab(
    name="layernorm_sp",
    title="LayerNorm gradients not synchronised under sequence parallelism",
    world=2,
    program=silent.norm_program,
    broken=silent.sync_norm_grads_broken,
    signature="sync_norm_grads(norm, world) -> None",
    compare=silent.norm_compare,
    hint="each rank's gradient of a replicated weight covers only its rows of the "
    "sequence; the loss sums over all of them, so sum the gradients over the "
    "ranks (an all-reduce, no division)",
)
SAMPLER = Lab(
    name="sampler",
    title="a sampler that feeds every rank the same data",
    world=2,
    program=silent.sampler_program,
    broken=silent.make_loader_broken,
    signature="make_loader(dataset, rank, world) -> DataLoader",
    compare=silent.sampler_compare,
    hint="give each rank its own share of the samples: a DataLoader with "
    "sampler=DistributedSampler(dataset, num_replicas=world, rank=rank)",
)
UNUSED_PARAMETERS = Lab(
    name="unused_parameters",
    title="torch DDP with a parameter the forward never uses",
    world=2,
    program=silent.unused_program,
    broken=silent.wrap_broken,
    signature="wrap(model) -> nn.Module",
    compare=silent.unused_compare,
    hint="DDP waits for a gradient of every parameter before it averages a "
    "bucket: pass find_unused_parameters=True (or drop the unused module)",
)

LABS: dict[str, Lab] = {
    lab.name: lab
    for lab in (
        SKIPPED_COLLECTIVE,
        COLLECTIVE_ORDER,
        PIPELINE_MICROBATCHES,
        UNEVEN_GATHER,
        DROPOUT_SEED,
        LAYERNORM_SP,
        SAMPLER,
        UNUSED_PARAMETERS,
    )
}

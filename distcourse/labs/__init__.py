"""When it breaks: the classic distributed bugs as short programs to run and fix.

Each lab (`LABS`, or `labs.SKIPPED_COLLECTIVE` ...) runs a broken program on real
ranks: `lab.run()` returns the report of what went wrong, within seconds, naming the
ranks and the last calls each one entered (comm/recorder.py's FlightRecorder);
`lab.check(fix)` runs the program with the reader's function and says PASS when every
rank matches one process. Reference fixes: `distcourse.labs.solutions`.

The method's tools, run live on spawned gloo ranks: `labs.tools` (DETAIL's report on
a mismatched collective, and the same-shape swap it misses; `monitored_barrier`
naming the missing ranks; torch DDP naming unused parameters) and `labs.stacks`
(torch's own Flight Recorder, which gloo records into in torch 2.14; each rank's
Python stack in a hang, by `faulthandler`).
"""

from distcourse.labs.catalog import (
    COLLECTIVE_ORDER,
    DROPOUT_SEED,
    LABS,
    LAYERNORM_SP,
    PIPELINE_MICROBATCHES,
    SAMPLER,
    SKIPPED_COLLECTIVE,
    UNEVEN_GATHER,
    UNUSED_PARAMETERS,
)
from distcourse.labs.lab import Lab, Report, Verdict

__all__ = [
    "COLLECTIVE_ORDER",
    "DROPOUT_SEED",
    "LABS",
    "LAYERNORM_SP",
    "PIPELINE_MICROBATCHES",
    "SAMPLER",
    "SKIPPED_COLLECTIVE",
    "UNEVEN_GATHER",
    "UNUSED_PARAMETERS",
    "Lab",
    "Report",
    "Verdict",
]

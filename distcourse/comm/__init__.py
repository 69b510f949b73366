"""Communication: collectives from point-to-point messages, and how to count them.

- `agree`: the cross-rank argument check that turns mismatched calls into errors;
- `ring`: ring all-reduce / all-gather / reduce-scatter, tree broadcast, naive;
- `ledger`: what each rank sends and receives; `costmodel`: the alpha-beta model.
"""

from distcourse.comm.agree import Members, agree, members
from distcourse.comm.costmodel import (
    Cost,
    bus_bandwidth,
    fit_alpha_beta,
    measure,
    predict,
)
from distcourse.comm.ledger import Ledger, Record
from distcourse.comm.ring import (
    naive_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
    tree_broadcast,
)

__all__ = [
    "Cost", "Ledger", "Members", "Record", "agree", "bus_bandwidth",
    "fit_alpha_beta", "measure", "members", "naive_all_reduce", "predict",
    "ring_all_gather", "ring_all_reduce", "ring_reduce_scatter", "tree_broadcast",
]  # fmt: skip

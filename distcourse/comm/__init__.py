"""Communication: collectives from point-to-point messages, and how to count them.

- `agree`: the cross-rank argument check that turns mismatched calls into errors;
- `ring`: ring all-reduce / all-gather / reduce-scatter, tree broadcast, naive;
- `tree`: binomial-tree reduce and all-reduce (reduce up, broadcast down);
- `autograd`: collectives with a backward (Megatron's f and g, split / gather,
  all-gather / reduce-scatter, all-to-all), for tensor parallel and global tensors;
- `p2p`: send / receive between neighbours with a shape handshake, for pipelines;
- `ledger`: what each rank sends and receives; `costmodel`: the alpha-beta model;
- `recorder`: a flight recorder on the ledger, each call noted before it runs.
"""

from distcourse.comm.agree import Members, agree, members
from distcourse.comm.autograd import (
    all_gather_along,
    all_to_all_along,
    copy_to_group,
    gather_from_group,
    reduce_from_group,
    reduce_scatter_along,
    split_sizes,
    split_to_group,
)
from distcourse.comm.costmodel import (
    Cost,
    bus_bandwidth,
    fit_alpha_beta,
    fit_collective,
    measure,
    predict,
    sent_per_rank,
    within_factor,
)
from distcourse.comm.ledger import Ledger, Record
from distcourse.comm.p2p import recv_tensor, send_recv, send_tensor
from distcourse.comm.recorder import Entry, FlightRecorder
from distcourse.comm.ring import (
    naive_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)
from distcourse.comm.tree import tree_all_reduce, tree_broadcast, tree_reduce

__all__ = [
    "Cost",
    "Entry",
    "FlightRecorder",
    "Ledger",
    "Members",
    "Record",
    "agree",
    "all_gather_along",
    "all_to_all_along",
    "bus_bandwidth",
    "copy_to_group",
    "fit_alpha_beta",
    "fit_collective",
    "gather_from_group",
    "measure",
    "members",
    "naive_all_reduce",
    "predict",
    "recv_tensor",
    "reduce_from_group",
    "reduce_scatter_along",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_reduce_scatter",
    "send_recv",
    "send_tensor",
    "sent_per_rank",
    "split_sizes",
    "split_to_group",
    "tree_all_reduce",
    "tree_broadcast",
    "tree_reduce",
    "within_factor",
]

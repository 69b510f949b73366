"""Figures for the book, one module per kind: `tensors` (values and where their pieces
live), `timing` (costs, timelines, Gantt charts), `duality` (what a conversion
sends forward and backward), `mesh` (ranks on a device mesh, their groups per axis,
bytes per axis, costs per layout), `schematics` (the pictures of a chapter's idea:
the ranks and their kernel, the ring, pipeline schedules on a perfect machine,
the map of strategies), `sharding` (who holds which model state under ZeRO's
stages; memory held against bytes sent), `composition` (the trainer's four
moves: stages, TP, recomputation, replicas), `experts` (tokens dispatched
between ranks; the load per expert against its capacity), `context` (ring
attention: the ring, the sequence split, the causal blocks per rank), `memory`
(loss curves side by side; a rank's memory stacked by kind), `recorded` (each rank's
recorded calls, and where the ranks part). Every function returns a matplotlib
Figure and never calls plt.show(); `figure` numbers, captions and describes one for
the book, and refuses one whose text the book would show too small to read.
"""

from distcourse.viz.composition import four_moves
from distcourse.viz.context import ring_blocks
from distcourse.viz.duality import conversion_bytes
from distcourse.viz.experts import dispatch_matrix, expert_load
from distcourse.viz.memory import loss_curves, memory_stacks, memory_timeline
from distcourse.viz.mesh import axis_bytes, layout_costs, mesh_groups
from distcourse.viz.numbered import Numbered, figure
from distcourse.viz.recorded import calls
from distcourse.viz.schematics import cluster, ring, schedule, strategies
from distcourse.viz.sharding import (
    bytes_against_ranks,
    memory_for_communication,
    who_holds,
)
from distcourse.viz.tensors import rank_tensors, sbp_pieces, tp_layout
from distcourse.viz.timing import cost_plot, gantt, hidden_sweep, timeline

__all__ = [
    "axis_bytes",
    "calls",
    "cluster",
    "conversion_bytes",
    "cost_plot",
    "dispatch_matrix",
    "expert_load",
    "figure",
    "four_moves",
    "gantt",
    "hidden_sweep",
    "layout_costs",
    "loss_curves",
    "memory_stacks",
    "memory_timeline",
    "bytes_against_ranks",
    "memory_for_communication",
    "mesh_groups",
    "Numbered",
    "rank_tensors",
    "ring",
    "ring_blocks",
    "sbp_pieces",
    "schedule",
    "strategies",
    "timeline",
    "tp_layout",
    "who_holds",
]

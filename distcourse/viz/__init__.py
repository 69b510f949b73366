"""Figures for the book, one module per kind: `tensors` (values and where their pieces
live), `timing` (costs, timelines, Gantt charts). Every function returns a matplotlib
Figure and never calls plt.show().
"""

from distcourse.viz.tensors import rank_tensors, sbp_pieces, tp_layout
from distcourse.viz.timing import cost_plot, gantt, hidden_sweep, timeline

__all__ = [
    "cost_plot",
    "gantt",
    "hidden_sweep",
    "rank_tensors",
    "sbp_pieces",
    "timeline",
    "tp_layout",
]

"""Starting ranks: `spawn` for tests, scripts and benchmarks; `cluster` for notebooks.

Nothing that runs a strategy imports this package: ranks are started from outside,
and `runtime` is what each of them uses. `cluster` (ipyparallel) is imported only
when asked for: `from distcourse.launch import cluster`.
"""

from distcourse.launch.spawn import spawn

__all__ = ["spawn"]

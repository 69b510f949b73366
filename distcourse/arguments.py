"""Argument checks that every layer of the package shares, so each is written once.

A count (ranks, stages, micro-batches, degrees) must be an int of at least 1, and
not a bool (True is an int in Python, but never meant as a count).
"""

from __future__ import annotations


def positive_int(value: object, name: str) -> int:
    """`value` if it is an int >= 1 (not a bool); else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value

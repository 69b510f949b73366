"""The solutions of `distcourse.exercises`: one module per chapter, one name per
exercise (`ch02.ring_all_reduce` answers `exercises.ch02.check_ring_all_reduce`).

Read them after trying: the book's appendix shows each one folded away.
"""

"""Exercises that check themselves: `distcourse.exercises.chNN.check_<name>(answer)`.

Each chapter has a module here (`ch01` ... `ch10`); each exercise in it is one
function `check_<name>(answer)` that runs the reader's answer, compares it with the
reference, prints one line (`PASS`, or `FAIL — what is wrong — hint: ...`, or `not
answered yet — hint: ...` for the placeholder None) and returns a bool. The
solutions live apart, in `distcourse.exercises.solutions.chNN`, one name per
exercise (`solutions.ch02.ring_all_reduce` for `ch02.check_ring_all_reduce`); the
book folds them away in its appendix, and tests/test_exercises_chapters.py runs each
solution (it must pass) and a wrong answer (it must fail, with its hint).

How a chapter module is written (the whole pattern; the helpers live in
`distcourse.exercises.core` only, and every chapter and test imports them from there)::

    '''Chapter 12's exercises: ... (one line per exercise).'''
    import torch
    import torch.distributed as dist
    from distcourse.exercises.core import (
        Problem, call, check_number, check_on_ranks, compare,
    )

    EXERCISES = ("expert_bytes", "route")  # the names, in the chapter's order

    def check_expert_bytes(answer: object) -> bool:
        '''Bytes one rank sends in the all_to_all of 8 ranks, T = 1 MiB: a number.'''
        return check_number(
            "ch12.expert_bytes", answer, 7 * 2**20 / 8,
            hint="all_to_all keeps its own piece and sends the other n - 1: (n-1)T/n",
        )

    def route_probe(answer: object) -> Problem:   # runs on every rank
        x = torch.arange(8.0) + dist.get_rank()
        got = call(answer, x)                    # the reader's code, errors caught
        return compare(got, x.flip(0), "the routed tensor")   # None: nothing wrong

    def check_route(answer: object) -> bool:
        '''A function `route(x) -> tensor`, run on 4 gloo ranks.'''
        return check_on_ranks(
            "ch12.route", answer, route_probe, 4, hint="send piece j to rank j ...",
        )

Other answers: `check_answer(name, answer, judge, hint=...)` judges anything
in-process (a schedule, a layout; `judge(answer)` returns None or what is wrong,
calling the reader's functions through `call`, within a time limit);
`check_table(name, answer, expected, hint=...)` compares a dict entry by entry
(strings without spaces or case), `check_per_rank(name, answer, expected,
what=..., hint=...)` a list of one entry per rank the same way;
`check_on_ranks(..., form=functions(2))` takes a pair of functions such as
Megatron's (f, g). Add the chapter's solutions to
`solutions/chNN.py` (one name per exercise), a wrong answer per exercise to
tests/test_exercises_chapters.py's WRONG (the test finds every `chNN` module), and
the chapter to book/appendix_solutions.md.

A probe is a module-level function (it travels to the ranks by reference) that
returns None or a sentence saying what is wrong on this rank. A hang in the reader's
code ends within the collective timeout, an exception is reported as one sentence
with its rank, and no rank outlives the check. Keep the numbers in a check's
docstring: the notebook cell that states the exercise names them.
"""

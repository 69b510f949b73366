"""Schedules are lists a test can read: each F before its B, every (stage, micro-batch)
once, 1F1B's in-flight bound, interleaving's order, and the bubble on paper."""

from __future__ import annotations

import functools

import pytest

from distcourse.parallel.pipeline import schedules as S
from distcourse.parallel.pipeline.zero_bubble import zb_h1


@pytest.mark.parametrize(
    "make",
    [
        lambda: S.gpipe(4, 6),
        lambda: S.one_f_one_b(4, 6),
        lambda: S.one_f_one_b(4, 2),
        lambda: S.interleaved(2, 4, 2),
        lambda: S.interleaved(4, 8, 2),
        lambda: S.interleaved(4, 4, 3),
    ],
    ids=["gpipe", "1f1b", "1f1b-m<p", "int-2", "int-4", "int-m=p"],
)
def test_every_schedule_is_complete_ordered_and_deadlock_free(make) -> None:
    s = make()
    S.check(s)  # each F and B once, F before B, transfers in matching order
    for r, acts in enumerate(s.actions):
        assert len(acts) == 2 * s.micro_batches * s.per_rank
        assert {a.stage for a in acts} == set(range(r, s.stages, s.ranks))
        for a in acts:  # every micro-batch's F comes before its B on each stage
            assert acts.index(S.Action("F", a.stage, a.micro)) <= acts.index(a)
    S.simulate(s)  # raises if ranks would wait for each other forever


def test_gpipe_holds_m_and_1f1b_at_most_p_micro_batches() -> None:
    assert S.in_flight(S.gpipe(4, 8)) == [8, 8, 8, 8]
    assert S.in_flight(S.one_f_one_b(4, 8)) == [4, 3, 2, 1]  # p - r <= p
    assert S.in_flight(S.one_f_one_b(4, 2)) == [2, 2, 2, 1]  # m < p: like GPipe
    assert S.one_f_one_b(2, 3).show() == (
        "rank 0: F0.0 F0.1 B0.0 F0.2 B0.1 B0.2\nrank 1: F1.0 B1.0 F1.1 B1.1 F1.2 B1.2"
    )


def test_interleaved_follows_megatrons_order() -> None:
    s = S.interleaved(2, 4, 2)  # stages 0, 2 on rank 0; 1, 3 on rank 1
    assert s.show() == (
        "rank 0: F0.0 F0.1 F2.0 F2.1 F0.2 B2.0 F0.3 B2.1 F2.2 B0.0 F2.3 B0.1 "
        "B2.2 B2.3 B0.2 B0.3\n"
        "rank 1: F1.0 F1.1 F3.0 B3.0 F3.1 B3.1 F1.2 B1.0 F1.3 B1.1 F3.2 B3.2 "
        "F3.3 B3.3 B1.2 B1.3"
    )
    assert [s.rank_of(st) for st in range(4)] == [0, 1, 0, 1]


@pytest.mark.parametrize(
    ("p", "m", "v"),
    [(2, 4, 1), (4, 8, 1), (4, 3, 1), (2, 4, 2), (4, 8, 2), (4, 12, 3), (4, 6, 2)],
)
def test_the_bubble_on_paper_is_the_formula(p: int, m: int, v: int) -> None:
    # equal stages, instant transfers: (p - 1) / (v m + p - 1) of the ranks' time
    for s in (
        [S.gpipe(p, m), S.one_f_one_b(p, m)] if v == 1 else [S.interleaved(p, m, v)]
    ):
        runs = S.simulate(s, forward=1.0, backward=2.0)
        end = max(e for acts in runs for _, _, e in acts)
        busy = sum(e - b for acts in runs for _, b, e in acts)
        assert 1 - busy / (p * end) == pytest.approx(S.bubble_formula(p, m, v))


def test_bad_sizes_and_schedules_are_refused() -> None:
    with pytest.raises(ValueError, match="micro_batches=9 does not split into 2"):
        S.interleaved(4, 9, 2)
    with pytest.raises(ValueError, match="micro_batches must be a positive integer"):
        S.gpipe(2, 0)
    good = S.one_f_one_b(2, 2)
    swapped = S.Schedule(
        "swapped",
        2,
        2,
        1,
        (
            good.actions[0],
            (
                S.Action("F", 1, 1),
                S.Action("F", 1, 0),
                S.Action("B", 1, 0),
                S.Action("B", 1, 1),
            ),
        ),
    )
    with pytest.raises(
        ValueError,
        match=r"transfers \('F', 0, 1\) are sent in the "
        r"order \[\(0, 0\), \(0, 1\)\] but received in",
    ):
        S.check(swapped)
    early = S.Schedule(
        "early",
        2,
        1,
        1,
        (
            (S.Action("B", 0, 0), S.Action("F", 0, 0)),
            good.actions[1][:0] + (S.Action("F", 1, 0), S.Action("B", 1, 0)),
        ),
    )
    with pytest.raises(ValueError, match="rank 0 runs B0.0 before its forward"):
        S.check(early)
    # complete and ordered, but rank 0 waits for B1.0, which waits for F0.1
    A = S.Action
    waits = S.Schedule(
        "waits",
        2,
        2,
        1,
        (
            (A("F", 0, 0), A("B", 0, 0), A("F", 0, 1), A("B", 0, 1)),
            (A("F", 1, 0), A("F", 1, 1), A("B", 1, 0), A("B", 1, 1)),
        ),
    )
    S.check(waits)
    with pytest.raises(
        ValueError,
        match=r"deadlock, ranks wait at \{0: 'B0.0', "
        r"1: 'F1.1'\}",
    ):
        S.simulate(waits)


def test_interleaving_takes_any_m_that_splits_into_rounds_as_torch_does() -> None:
    # torch's ScheduleInterleaved1F1B: max(1, m // p) equal rounds; m = p k as before
    for p in range(2, 7):
        for v in (1, 2, 3):
            for m in range(1, 4 * p + 1):
                if m % max(1, m // p):
                    with pytest.raises(ValueError, match="equal rounds"):
                        S.interleaved(p, m, v)
                    continue
                s = S.interleaved(p, m, v)
                S.check(s)
                S.simulate(s)  # no deadlock
    assert (
        S.interleaved(4, 6, 2)
        .show()
        .splitlines()[3]
        .startswith("rank 3: F3.0 F3.1 F3.2 F3.3 F3.4 F3.5 F7.0 B7.0")
    )


def test_simulate_takes_a_time_per_stage() -> None:
    # 2 stages, m = 2: F0 0-1, F0 1-2; F1 1-4, B1 4-10, F1 10-13, B1 13-19; B0 10-12,
    # 19-21: an unbalanced pipe waits for its slow stage
    runs = S.simulate(S.one_f_one_b(2, 2), forward=[1.0, 3.0], backward=[2.0, 6.0])
    assert max(e for acts in runs for _, _, e in acts) == 21.0
    with pytest.raises(ValueError, match="one each"):
        S.simulate(S.one_f_one_b(2, 2), forward=[1.0])


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_every_schedules_messages_match_without_tags(p: int) -> None:
    """NCCL pairs the messages between two ranks in issue order, tags ignored: on
    every ordered pair, the sender's order is the receiver's, for GPipe, 1F1B,
    interleaved 1F1B (v = 2, 3) and ZB-H1, at every m they take up to 16."""
    makers = [S.gpipe, S.one_f_one_b, zb_h1]
    makers += [functools.partial(S.interleaved, v=v) for v in (2, 3)]
    seen = 0
    for make in makers:
        for m in range(1, 17):
            try:
                schedule = make(p, m)
            except ValueError:  # m this schedule does not take
                continue
            seen += 1
            order = S.tagless_order(schedule)
            assert order and set(order.values()) == {None}, (schedule.name, m, order)
    assert seen >= 40


def test_tagless_order_names_the_first_message_out_of_order() -> None:
    a = S.Action
    first, second = [a("F", 0, 0), a("F", 0, 1)], [a("B", 0, 0), a("B", 0, 1)]
    swapped = [a("F", 1, 1), a("F", 1, 0), a("B", 1, 0), a("B", 1, 1)]
    bad = S.Schedule("swapped", 2, 2, 1, (tuple(first + second), tuple(swapped)))
    assert S.tagless_order(bad) == {
        (0, 1): "message 0: rank 0 sends F0.0, rank 1 wants F0.1",
        (1, 0): None,
    }


def test_a_count_that_does_not_split_names_the_nearest_that_do() -> None:
    # chapter 5 once hinted "m below p, or a multiple of the rounds": 14 on 4 ranks is
    # a multiple of neither 4 nor 3, and 5 to 7 ran; the hint must name counts that run
    for p in range(2, 7):
        for m in range(2 * p, 6 * p):
            if m % (m // p) == 0:
                continue
            with pytest.raises(ValueError, match="the nearest that do") as err:
                S.interleaved(p, m, 2)
            below, above = (
                int(n)
                for n in str(err.value)
                .split("the nearest that do: ")[1]
                .split(";")[0]
                .split(" and ")
            )
            assert below < m < above
            for fine in (below, above, 2 * p - 1):
                S.check(S.interleaved(p, fine, 2))  # they run

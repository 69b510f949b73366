"""Pipeline schedules as data: for each rank, the list of actions it runs, in order.

An action is (kind, stage, micro-batch): "F" a forward, "B" a backward; a schedule
that also has "W" actions splits the backward: B computes only the input's gradient,
W later the weights' (zero_bubble). A schedule only orders work; the runner derives
the transfers from it (F on stage s > 0 first receives s - 1's activation; B on
stage s < last first receives s + 1's gradient).
Stage s lives on rank s % p, so with v stages per rank (interleaving) rank r holds
stages r, r + p, r + 2p, ... Because a schedule is a plain list, tests can read it:
every F before its B, every (stage, micro-batch) exactly once, how many micro-batches
are in flight, and whether the transfers between two ranks happen in the same order
on both (the runner's channels need that, or they would wait for each other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest

from distcourse.arguments import positive_int


@dataclass(frozen=True)
class Action:
    """One unit of work on one rank: a forward or backward of one micro-batch."""

    kind: str  # "F", "B" or "W"
    stage: int
    micro: int

    def __str__(self) -> str:
        return f"{self.kind}{self.stage}.{self.micro}"


@dataclass(frozen=True)
class Schedule:
    """Who does what, in which order: `actions[r]` is rank r's list."""

    name: str
    ranks: int  # p
    micro_batches: int  # m
    per_rank: int  # v, stages per rank
    actions: tuple[tuple[Action, ...], ...]

    @property
    def stages(self) -> int:
        return self.ranks * self.per_rank

    @property
    def split(self) -> bool:
        """Whether the backward is split into B (input) and W (weights)."""
        return any(a.kind == "W" for acts in self.actions for a in acts)

    def rank_of(self, stage: int) -> int:
        """The rank that holds `stage` (stage s on rank s % p)."""
        return stage % self.ranks

    def show(self) -> str:
        """One line per rank, e.g. 'rank 0: F0.0 F0.1 B0.0 B0.1'."""
        return "\n".join(
            f"rank {r}: " + " ".join(map(str, acts))
            for r, acts in enumerate(self.actions)
        )


def _check_sizes(name: str, p: int, m: int, v: int = 1) -> None:
    for label, n in (("ranks", p), ("micro_batches", m), ("stages per rank", v)):
        positive_int(n, f"{name}: {label}")


def gpipe(p: int, m: int) -> Schedule:
    """GPipe: every micro-batch forward, then every backward (m in flight)."""
    _check_sizes("gpipe", p, m)
    acts = [
        [Action("F", r, j) for j in range(m)] + [Action("B", r, j) for j in range(m)]
        for r in range(p)
    ]
    return Schedule("GPipe", p, m, 1, tuple(map(tuple, acts)))


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B: p - 1 - r warm-up forwards on rank r, then alternate; at most p - r in
    flight. With m < p it needs no more micro-batches: it becomes GPipe."""
    _check_sizes("1F1B", p, m)
    acts = []
    for r in range(p):
        warm = min(p - 1 - r, m)
        seq = [Action("F", r, j) for j in range(warm)]
        for i in range(m - warm):
            seq += [Action("F", r, warm + i), Action("B", r, i)]
        seq += [Action("B", r, j) for j in range(m - warm, m)]
        acts.append(tuple(seq))
    return Schedule("1F1B", p, m, 1, tuple(acts))


def _splits(m: int, p: int, step: int) -> int:
    """The nearest micro-batch count from m, going by `step`, that splits into
    max(1, m // p) equal rounds."""
    while m % max(1, m // p):
        m += step
    return m


def interleaved(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B (Megatron-LM): v stages per rank; the bubble shrinks by v.

    Micro-batches run in rounds of g: each rank runs g forwards of its first stage,
    then g of its second, and so on. Megatron-LM's paper takes g = p, so m must be
    a multiple of p; like torch's ScheduleInterleaved1F1B, this takes any m that
    splits into max(1, m // p) equal rounds (g = m when m < p): 6 or 10 on 4 ranks,
    not 9. `check` and `simulate` prove each such schedule free of deadlock."""
    _check_sizes("interleaved 1F1B", p, m, v)
    rounds = max(1, m // p)
    if m % rounds:
        below, above = _splits(m, p, -1), _splits(m, p, +1)
        raise ValueError(
            f"interleaved 1F1B runs micro-batches in m // p = {rounds} equal rounds: "
            f"micro_batches={m} does not split into {rounds} on {p} ranks (the "
            f"nearest that do: {below} and {above}; every m up to {2 * p - 1} runs "
            "as one round; torch's ScheduleInterleaved1F1B has the same rule)"
        )
    g = m // rounds  # micro-batches per round
    total = m * v  # (stage, micro-batch) pairs per rank

    def unit(k: int, backward: bool) -> tuple[int, int]:  # (chunk, micro-batch)
        chunk = (k // g) % v
        return (v - 1 - chunk if backward else chunk), (k // (g * v)) * g + k % g

    acts = []
    for r in range(p):
        warm = total if m == p else min((p - r - 1) * 2 + (v - 1) * g, total)
        order = [("F", k) for k in range(warm)]
        for i in range(total - warm):
            order += [("F", warm + i), ("B", i)]
        order += [("B", k) for k in range(total - warm, total)]
        seq = []
        for kind, k in order:
            chunk, micro = unit(k, kind == "B")
            seq.append(Action(kind, chunk * p + r, micro))
        acts.append(tuple(seq))
    return Schedule(f"interleaved 1F1B (v={v})", p, m, v, tuple(acts))


def check(schedule: Schedule) -> None:
    """ValueError unless each rank does each of its stages' F and B once per
    micro-batch, every F before its B, and the transfers between any two ranks come
    in the same order on the sender and the receiver."""
    p, m = schedule.ranks, schedule.micro_batches
    kinds = "FBW" if schedule.split else "FB"
    for r, acts in enumerate(schedule.actions):
        want = {
            (k, s, j)
            for s in range(r, schedule.stages, p)
            for j in range(m)
            for k in kinds
        }
        got = [(a.kind, a.stage, a.micro) for a in acts]
        if len(got) != len(set(got)) or set(got) != want:
            raise ValueError(
                f"{schedule.name}: rank {r} does not run each "
                f"{' and '.join(kinds)} of its stages once per "
                "micro-batch"
            )
        for i, a in enumerate(got):
            before = {"B": "F", "W": "B"}.get(a[0])
            if before and got.index((before, a[1], a[2])) > i:
                what = "forward" if before == "F" else "input gradient (B)"
                raise ValueError(
                    f"{schedule.name}: rank {r} runs {a[0]}{a[1]}.{a[2]} "
                    f"before its {what}"
                )
    for link, (sent, received) in transfers(schedule).items():
        if sent != received:
            raise ValueError(
                f"{schedule.name}: transfers {link} are sent in the "
                f"order {sent} but received in {received}"
            )


def transfers(schedule: Schedule) -> dict[tuple, tuple[list, list]]:
    """For each channel (kind, src rank, dst rank): the (stage, micro-batch) order in
    which src sends and in which dst receives. "F" carries activations forward."""
    last = schedule.stages - 1
    out: dict[tuple, tuple[list, list]] = {}
    for acts in schedule.actions:
        for a in acts:
            if a.kind == "W":  # weights' gradients stay on their rank
                continue
            here = schedule.rank_of(a.stage)
            nxt = a.stage + 1 if a.kind == "F" else a.stage - 1
            if 0 <= nxt <= last:  # this action sends
                link = (a.kind, here, schedule.rank_of(nxt))
                out.setdefault(link, ([], []))[0].append((a.stage, a.micro))
            prev = a.stage - 1 if a.kind == "F" else a.stage + 1
            if 0 <= prev <= last:  # this action first receives
                link = (a.kind, schedule.rank_of(prev), here)
                out.setdefault(link, ([], []))[1].append((prev, a.micro))
    return out


def tagless_order(schedule: Schedule) -> dict[tuple[int, int], str | None]:
    """Per ordered pair of ranks (src, dst) that exchange messages: None if the
    messages src sends dst, all kinds together in src's issue order, are the ones
    dst receives from src in its own issue order; else the first mismatch.

    This is what matching without tags does: NCCL ignores p2p tags and pairs the
    messages between two ranks in issue order (torch's docs of `send`/`isend`;
    pytorch/pytorch#94819). A runner that sends activations and gradients between
    one pair on one group and tells them apart by tag is right on NCCL only where
    every pair here is None. Messages are named kind stage.micro-batch, the stage
    being the sender's ("F0.3": stage 0's activation of micro-batch 3).
    """
    last = schedule.stages - 1
    sent: dict[tuple[int, int], list[str]] = {}
    got: dict[tuple[int, int], list[str]] = {}
    for here, acts in enumerate(schedule.actions):
        for a in acts:
            if a.kind == "W":
                continue
            step = 1 if a.kind == "F" else -1
            prev, nxt = a.stage - step, a.stage + step
            if 0 <= prev <= last:  # receives first, as the runners do
                pair = (schedule.rank_of(prev), here)
                got.setdefault(pair, []).append(f"{a.kind}{prev}.{a.micro}")
            if 0 <= nxt <= last:
                pair = (here, schedule.rank_of(nxt))
                sent.setdefault(pair, []).append(f"{a.kind}{a.stage}.{a.micro}")
    out: dict[tuple[int, int], str | None] = {}
    for pair in sorted(sent.keys() | got.keys()):
        both = zip_longest(sent.get(pair, []), got.get(pair, []), fillvalue="nothing")
        wrong = [(k, x, y) for k, (x, y) in enumerate(both) if x != y]
        out[pair] = None
        if wrong:
            k, x, y = wrong[0]
            out[pair] = (
                f"message {k}: rank {pair[0]} sends {x}, rank {pair[1]} wants {y}"
            )
    return out


def in_flight(schedule: Schedule) -> list[int]:
    """Per rank: the most micro-batches whose forward ran but backward has not
    (each holds its activations; with a split backward, until its W). GPipe m;
    1F1B p - r on rank r."""
    peaks = []
    last = "W" if schedule.split else "B"
    for acts in schedule.actions:
        live = peak = 0
        for a in acts:
            live += 1 if a.kind == "F" else -1 if a.kind == last else 0
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def bubble_formula(p: int, m: int, v: int = 1) -> float:
    """Idle share of p ranks' time: (p - 1) / (v m + p - 1), equal F and B times.

    v = 1 gives GPipe's and 1F1B's (p - 1) / (m + p - 1); relative to the work,
    interleaving's bubble is (p - 1) / (v m).
    """
    return (p - 1) / (v * m + p - 1)


def simulate(
    schedule: Schedule,
    forward: float | Sequence[float] = 1.0,
    backward: float | Sequence[float] = 2.0,
) -> list[list[tuple[Action, float, float]]]:
    """Run the schedule on paper: per rank, (action, start, end) with these stage
    times (one for all stages, or one per stage) and free, instant transfers (a
    split backward: half in B, half in W). ValueError if the ranks would wait for
    each other forever. Gives the bubble a perfect machine would have, and with
    measured stage times the step an ideal pipeline of those stages would take."""
    last, p = schedule.stages - 1, schedule.ranks
    fw, bw = (
        [float(t)] * schedule.stages if isinstance(t, int | float) else list(t)
        for t in (forward, backward)
    )
    if len(fw) != schedule.stages or len(bw) != schedule.stages:
        raise ValueError(f"stage times for {schedule.stages} stages, one each")
    half = 0.5 if schedule.split else 1.0
    took = {"F": fw, "B": [half * t for t in bw], "W": [t / 2 for t in bw]}
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, micro) -> end
    clock, pos = [0.0] * p, [0] * p
    out: list[list[tuple[Action, float, float]]] = [[] for _ in range(p)]
    while any(pos[r] < len(schedule.actions[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(schedule.actions[r]):
                a = schedule.actions[r][pos[r]]
                prev = a.stage - 1 if a.kind == "F" else a.stage + 1
                mine = {"B": "F", "W": "B"}.get(a.kind)
                need = [(mine, a.stage, a.micro)] if mine else []
                if 0 <= prev <= last and a.kind != "W":
                    need.append((a.kind, prev, a.micro))
                if any(n not in done for n in need):
                    break
                start = max([clock[r]] + [done[n] for n in need])
                clock[r] = start + took[a.kind][a.stage]
                done[(a.kind, a.stage, a.micro)] = clock[r]
                out[r].append((a, start, clock[r]))
                pos[r], moved = pos[r] + 1, True
        if not moved:
            stuck = {
                r: str(schedule.actions[r][pos[r]])
                for r in range(p)
                if pos[r] < len(schedule.actions[r])
            }
            raise ValueError(f"{schedule.name}: deadlock, ranks wait at {stuck}")
    return out

"""``--search refine``: successive refinement around the best so far, one restart a candidate.

The plan's axes make a lattice (an axis of numbers in order of magnitude, one of words as
given). The search starts in the middle of every axis, then measures the neighbours of the best
so far a step along one axis at a time, up before down, the move that last found a better one
first. A neighbour that ranks above it (``outcome.rank``: goodput, or ``--rank-by``'s J/token or
$/1M — the final ranking's own order, so a gentle slope is climbed) becomes the best and its
neighbours come next; when every neighbour at the step is measured and none is better, the
steps halve. Each axis' first step is a quarter of its values (at least one); at one step the
pairs of axes are tried together too (a ridge across two axes, such as a batch cap and a token
budget that must grow together), and when none of those is better the search has converged.

Patience: K candidates in a row without a significant gain stop it — significant as every
verdict of SPEC §5.14 (``verdict.separation.judge_gain``: ``gain_min`` or more, its interval
above zero, over the candidate that made the last significant gain, with the spread every
measured candidate shares). A flat landscape stops after 1 + K restarts.

Pure and replayed: ``next_step`` walks from the start on the results it is given (by
candidate), and returns the first candidate it needs that has none, or why it stopped. Every
choice depends only on the results the walk consumed before it, so a resumed run chooses the
same next candidates given the same results.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.gpu.energy import RANK_FIELDS, RankBy
from calibrate.stages.tune.grid import Axis, Candidate
from calibrate.stages.tune.outcome import healthy, rank
from calibrate.stages.tune.result import CandidateResult
from calibrate.stages.verdict.separation import Sample, judge_gain, pooled

Point = tuple[int, ...]  # a position on each axis, counted from its smallest value
Move = tuple[tuple[int, int], ...]  # (axis, +1 or -1) for one axis, or two together


@dataclass(frozen=True)
class Rule:
    """When the search stops and what counts as better."""

    patience: int  # candidates in a row without a significant gain
    gain_min: float = 0.10  # [sweep] gain_min: the least a gain must add to be significant
    level: float = DEFAULT_LEVEL  # [confidence] level of its interval
    rank_by: RankBy = "goodput"


@dataclass(frozen=True)
class Next:
    """The candidate to measure next, and why the search chose it."""

    candidate: Candidate
    why: str


@dataclass(frozen=True)
class Stopped:
    """Why the search needs no further candidate."""

    reason: Literal["converged", "patience"]
    text: str


class Lattice:
    """The grid's candidates by position: axis k's position p is its p-th smallest value."""

    def __init__(self, axes: Sequence[Axis], pool: Sequence[Candidate]) -> None:
        self.axes = tuple(axes)
        self.pool = tuple(pool)  # in grid order: the first axis varies slowest
        self.orders = tuple(axis.in_order() for axis in axes)
        self.sizes = tuple(len(axis.values) for axis in axes)
        strides, stride = [], 1
        for size in reversed(self.sizes):
            strides.append(stride)
            stride *= size
        self.strides = tuple(reversed(strides))

    @property
    def start(self) -> Point:
        """The middle of every axis (the upper middle of an even count)."""
        return tuple(size // 2 for size in self.sizes)

    def candidate(self, point: Point) -> Candidate:
        offset = sum(
            order[p] * stride
            for order, p, stride in zip(self.orders, point, self.strides, strict=True)
        )
        return self.pool[offset]

    def value(self, k: int, p: int) -> str:
        return self.axes[k].values[self.orders[k][p]]

    def moved(self, point: Point, move: Move, steps: Sequence[int]) -> Point:
        """``point`` moved along ``move``'s axes by their steps, stopped at each axis' ends."""
        out = list(point)
        for k, sign in move:
            out[k] = min(max(point[k] + sign * steps[k], 0), self.sizes[k] - 1)
        return tuple(out)

    def describe(self, here: Point, there: Point) -> str:
        """``max_num_seqs 16 → 32, max_num_batched_tokens 4096 → 2048``."""
        return ", ".join(
            f"{axis.key} {self.value(k, here[k])} → {self.value(k, there[k])}"
            for k, axis in enumerate(self.axes)
            if here[k] != there[k]
        )


def objective(result: CandidateResult, rank_by: RankBy) -> Sample | None:
    """What "better" is judged on, larger being better: the goodput of each run at the best
    level; for ``--rank-by`` J/token or $/1M, their inverse at the best level (one figure, no
    runs: the median alone decides). None when the candidate served no passing level."""
    best = result.best
    if best is None or not healthy(result):
        return None
    column = RANK_FIELDS.get(rank_by)
    if column is not None:
        cost = getattr(best, column)
        return Sample.of([1 / cost]) if cost else None
    runs = best.runs_per_s or (best.goodput_per_s,)
    return Sample.of(runs) if best.goodput_per_s > 0 else None


@dataclass
class _Patience:
    """Counts the candidates since the last significant gain."""

    rule: Rule
    anchor: CandidateResult | None = None  # the one that made the last significant gain
    since: int = 0
    samples: list[Sample] = field(default_factory=list)

    def after(self, result: CandidateResult) -> Stopped | None:
        sample = objective(result, self.rule.rank_by)
        if sample is not None:
            self.samples.append(sample)
        if sample is not None and self._gains(sample):
            self.anchor, self.since = result, 0
            return None
        self.since += 1
        if self.since < self.rule.patience:
            return None
        over = self.anchor.candidate.id if self.anchor else "a candidate that served"
        return Stopped(
            "patience",
            f"patience: {self.since} candidates in a row without a significant gain over {over} "
            f"(at least {self.rule.gain_min:.0%}, its interval above zero)",
        )

    def _gains(self, sample: Sample) -> bool:
        anchor = objective(self.anchor, self.rule.rank_by) if self.anchor else None
        if anchor is None:
            return True
        shared = pooled(self.samples)
        verdict = judge_gain(anchor, sample, self.rule.gain_min, self.rule.level, shared)
        return verdict == "gain"


Walk = Generator[Next, CandidateResult, Stopped]


def _walk(lattice: Lattice, rule: Rule) -> Walk:
    """The search as a coroutine: yields the candidate it needs, is sent its result."""
    known: dict[Point, CandidateResult] = {}
    patience = _Patience(rule)

    def measure(point: Point, why: str) -> Generator[Next, CandidateResult, Stopped | None]:
        result = yield Next(lattice.candidate(point), why)
        known[point] = result
        return patience.after(result)

    def better(there: Point, here: Point) -> bool:
        """``there`` ranks above ``here`` (the final ranking's order: a gentle slope is
        climbed; patience, not the walk, asks whether a gain is significant)."""
        return rank([known[here], known[there]], rule.rank_by)[0] is known[there]

    here = lattice.start
    stop = yield from measure(here, "the middle of every axis")
    if stop is not None:
        return stop
    steps = [max(1, size // 4) for size in lattice.sizes]
    last: Move | None = None  # the move that last found a better one
    while True:
        moved = False
        for move in _moves(len(steps), last, diagonal=all(step == 1 for step in steps)):
            there = lattice.moved(here, move, steps)
            if there == here or there in known:
                continue
            why = f"next to {known[here].candidate.id}, the best so far: {lattice.describe(here, there)}"
            stop = yield from measure(there, why)
            if stop is not None:
                return stop
            if better(there, here):
                here, last, moved = there, move, True
                break
        if moved:
            continue
        if all(step == 1 for step in steps):
            found = known[here].candidate.id
            return Stopped(
                "converged",
                f"converged: no neighbour of {found} (one step along each axis and each pair "
                "of axes) is better",
            )
        steps = [max(1, step // 2) for step in steps]
        last = None  # a finer step starts without the coarse one's momentum


def _moves(axes: int, last: Move | None, *, diagonal: bool) -> list[Move]:
    """Each axis up and down (the last successful move first); at one step also each pair of
    axes together (a ridge across two axes is followed)."""
    single: list[Move] = [((k, sign),) for k in range(axes) for sign in (1, -1)]
    pairs: list[Move] = [
        ((a, sa), (b, sb))
        for a in range(axes)
        for b in range(a + 1, axes)
        for sa, sb in ((1, 1), (-1, -1), (1, -1), (-1, 1))
    ]
    every = single + (pairs if diagonal else [])
    return [last, *(m for m in every if m != last)] if last is not None else every


def replay(
    axes: Sequence[Axis],
    pool: Sequence[Candidate],
    results: Mapping[int, CandidateResult],
    rule: Rule,
) -> tuple[list[Next], Next | Stopped]:
    """The search replayed on ``results`` (by candidate index): the candidates it chose that
    have one, in order, with why; then the first it needs that has none, or why it stops."""
    walk = _walk(Lattice(axes, pool), rule)
    chosen: list[Next] = []
    try:
        ask = next(walk)
        while (found := results.get(ask.candidate.index)) is not None:
            chosen.append(ask)
            ask = walk.send(found)
    except StopIteration as end:
        stopped: Stopped = end.value
        return chosen, stopped
    return chosen, ask

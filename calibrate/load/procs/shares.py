"""How N processes split one load, and how their runs become the one run a single process makes.

Pure arithmetic on counts and times — no process, no clock — so the split and the merge are
tested in milliseconds. Every time a child hands back is in seconds since *its* start; the
parent shifts it by ``offset`` (the child's start minus the parent's, both readings of
CLOCK_MONOTONIC, one clock for every process of the machine) onto the parent's line. Epoch
stamps (``RequestTimes``) need nothing: each child takes the parent's anchor of that clock to
wall time (``request_times.use_anchor``), so they are on one line already.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import replace

from calibrate.load.items import ItemResult
from calibrate.load.pacing import Answer, OpenRun
from calibrate.load.window import LevelWindow, LoopRun

AHEAD_MIN = 8  # requests a worker holds beyond its share in flight, at least


def ahead(share: int) -> int:
    """Requests sent to a worker before its loop starts: its share, and as many again (at
    least ``AHEAD_MIN``) so that a burst of answers never waits on the parent."""
    return share + max(share, AHEAD_MIN)


def started_after(child_started_at: float | None, started_at: float) -> float:
    """A worker's start after the parent's, in s (both epoch stamps on one anchor)."""
    return child_started_at - started_at if child_started_at is not None else 0.0


def split_concurrency(concurrency: int, workers: int) -> list[int]:
    """C over at most C processes as evenly as can be, each at least 1: 10 over 3 → 4, 3, 3."""
    concurrency = max(1, concurrency)
    count = max(1, min(workers, concurrency))
    base, extra = divmod(concurrency, count)
    return [base + (1 if n < extra else 0) for n in range(count)]


def share_windows(window: LevelWindow, shares: Sequence[int]) -> list[LevelWindow]:
    """Each process's window: the same time, its share of the requests (4×C over all of them
    is 4×c of each; rounded up, so together never fewer than one process would start)."""
    total = sum(shares)
    return [
        LevelWindow(window.min_s, math.ceil(window.min_requests * share / total))
        for share in shares
    ]


def deal(count: int, workers: int, cap: int | None) -> list[list[int]]:
    """Which requests of an open-loop schedule each process sends, over no more processes than
    there are requests or in-flight slots: dealt in turn, each process as many of every
    ``cap`` requests as it has of the cap's slots (``split_cap``; no cap: one each in turn). A
    share of the rate larger than a share of the slots would hold a process's sends back at a
    rate the server keeps up with, read as the server's saturation."""
    processes = max(1, min(workers, count or 1, cap if cap is not None else workers))
    weights = [w or 1 for w in split_cap(cap, processes)]
    total = sum(weights)
    credit = [0] * processes
    dealt: list[list[int]] = [[] for _ in range(processes)]
    for n in range(count):  # smooth weighted turns: 2, 1 deals 0, 1, 0, 0, 1, 0, …
        credit = [c + w for c, w in zip(credit, weights, strict=True)]
        k = max(range(processes), key=credit.__getitem__)
        credit[k] -= total
        dealt[k].append(n)
    return dealt


def split_cap(cap: int | None, processes: int) -> list[int | None]:
    """The in-flight cap over the processes (None: no cap), each at least 1."""
    if cap is None:
        return [None] * processes
    return list(split_concurrency(cap, processes))


def _shifted(item: ItemResult, offset: float) -> ItemResult:
    if not offset:
        return item
    return replace(item, started_s=item.started_s + offset, done_s=item.done_s + offset)


def renumbered(items: Sequence[ItemResult]) -> dict[int, ItemResult]:
    """Each item (by identity) numbered 1…n in the order the requests started, as one process
    numbers them (requests a process was sent but never started leave no gap); a prompt
    list's items stay together."""
    order = sorted(items, key=lambda i: (i.started_s, i.index))
    return {id(item): replace(item, index=n) for n, item in enumerate(order, start=1)}


def merge_waves(
    parts: Sequence[tuple[Sequence[ItemResult], float, float]],
) -> tuple[list[ItemResult], float]:
    """The processes' parts of one wave (items, wall time, offset) as ``Sender.send`` hands a
    wave back: every item in index order, timed from the first send of any process to the
    last answer of any."""
    first = min(offset for _, _, offset in parts)
    items = [_shifted(i, offset - first) for part, _, offset in parts for i in part]
    wall_s = max(offset + wall for _, wall, offset in parts) - first
    return sorted(items, key=lambda i: i.index), wall_s


def merge_loops(runs: Sequence[tuple[LoopRun, float]], started_at: float | None) -> LoopRun:
    """The processes' closed-loop runs (each with its offset) as one: every item, full when the
    last process had all its slots started (every one of the C), the drain from the first
    process that stopped (fewer than C in flight from then on), the wall time the longest.
    The processes' parts hold the very items of the merged run, so an answer counted in a
    part's window is known in the run by identity (the records mark it ``steady``)."""
    mine = [tuple(_shifted(i, offset) for i in run.items) for run, offset in runs]
    number = renumbered([i for part in mine for i in part])
    items = tuple(sorted(number.values(), key=lambda i: i.index))
    fulls = [run.full_s + offset if run.full_s is not None else None for run, offset in runs]
    stops = [run.stop_s + offset for run, offset in runs if run.stop_s is not None]
    closes = [run.closed_s + offset for run, offset in runs if run.closed_s is not None]
    full_s = None if any(f is None for f in fulls) else max(f for f in fulls if f is not None)
    return LoopRun(
        items,
        max(run.total_s + offset for run, offset in runs),
        full_s,
        min(stops) if stops else None,
        started_at,
        min(closes) if closes and len(closes) == len(stops) else None,
        tuple(
            _part(run, offset, started_at, tuple(number[id(i)] for i in part))
            for (run, offset), part in zip(runs, mine, strict=True)
        )
        if len(runs) > 1
        else (),
    )


def _part(
    run: LoopRun, offset: float, started_at: float | None, items: tuple[ItemResult, ...]
) -> LoopRun:
    """One process's run on the merged run's clock: its steady window is aligned with the
    others' (``window.aligned``), never counted as if one process had made every answer."""

    def moved(value: float | None) -> float | None:
        return None if value is None else value + offset

    return LoopRun(
        items,
        run.total_s + offset,
        moved(run.full_s),
        moved(run.stop_s),
        started_at,
        moved(run.closed_s),
    )


def _in_flight(answers: Sequence[Answer]) -> tuple[int, ...]:
    """Requests in flight just before each send, in send order, over every process."""
    starts = sorted(a.started_s for a in answers)
    ends = sorted(a.done_s for a in answers)
    return tuple(n - bisect.bisect_right(ends, s) for n, s in enumerate(starts))


def merge_open(runs: Sequence[tuple[OpenRun, float, Sequence[int]]]) -> OpenRun:
    """The processes' open-loop runs (each with its offset and the schedule's indices it sent)
    as one: in flight counted over all of them at each send, each send's lag in schedule
    order, and the time sends waited on a cap the longest any process waited (they wait side
    by side, not one after another)."""
    items = sorted(
        (_shifted(i, offset) for run, offset, _ in runs for i in run.items), key=lambda i: i.index
    )
    answers = tuple(
        Answer(a.started_s + offset, a.elapsed_s, a.ok)
        for run, offset, _ in runs
        for a in run.requests
    )
    lags = sorted(
        (index, lag) for run, _, dealt in runs for index, lag in zip(dealt, run.lag_s, strict=False)
    )
    return OpenRun(
        tuple(items),
        max(run.total_s + offset for run, offset, _ in runs),
        max(run.last_send_s + offset for run, offset, _ in runs),
        _in_flight(answers),
        max(run.capped_s for run, _, _ in runs),
        tuple(lag for _, lag in lags),
        answers,
    )

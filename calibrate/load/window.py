"""How long one run of a sweep level lasts, and which part of it is measured (SPEC §5.6).

Pure arithmetic on times in seconds since the run started — no clock, no I/O — so the closed
loop's window can be tested with a fake clock and the knee with scripted numbers.

A run keeps C requests in flight (a new one starts as soon as one finishes) until it has lasted
``min_s`` *and* started ``min_requests``; then it stops starting requests and drains. Throughput
is counted over the **steady window**: it opens at the first answer after the C-th request
started (C in flight) and closes at the first answer to finish that was not replaced (the drain
began); the answers after the first, up to and including the last, over that time (each answer's
finish is its recorded ``finished_at``, SPEC §4.1). Both ends are answers,
so the count is not biased by where in a request's life the window starts; the ramp-up and the
drain, where fewer than C are in flight, are left out.

Both ends are read on the answers' own clock. When C answers end together (a server's batch),
calibrate handles them one after another: the first handled once the window is done is not
replaced, but the others of its burst finished before calibrate decided so, and closing at that
decision would count them too — up to C − 1 answers too many (measured: 7 answers for 6 at
concurrency 2 in a short window, +16 %).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from calibrate.load.items import ItemResult

MIN_REQUESTS_PER_SLOT = 4  # each run starts at least 4×C requests
P50_MULTIPLE = 3  # and lasts at least 3× the previous level's median latency


@dataclass(frozen=True)
class LevelWindow:
    """When a run of a level may stop starting requests."""

    min_s: float
    min_requests: int

    def done(self, elapsed_s: float, started: int) -> bool:
        return elapsed_s >= self.min_s and started >= self.min_requests


def level_window(level_s: float, concurrency: int, previous_p50_s: float | None) -> LevelWindow:
    """At least ``level_s``, at least 3× the previous level's p50 latency, at least 4×C requests."""
    longest = max(level_s, P50_MULTIPLE * previous_p50_s if previous_p50_s else 0.0)
    return LevelWindow(longest, MIN_REQUESTS_PER_SLOT * concurrency)


@dataclass(frozen=True)
class LoopRun:
    """One closed-loop run: every item, the wall time, and the steady window's edges."""

    items: tuple[ItemResult, ...]
    total_s: float
    full_s: float | None  # when the C-th request started (None: fewer were ever started)
    stop_s: float | None  # when the drain began (None: stopped by a stuck worker)
    started_at: float | None = None  # the run's start in epoch s, when on the requests' clock
    # when the first answer that was not replaced finished (``finished_s``): the steady window's
    # end; None: ``stop_s``
    closed_s: float | None = None
    # --workers: each process's own run on this run's clock (``steady_throughput`` aligns them)
    parts: tuple[LoopRun, ...] = ()

    def finished_s(self, item: ItemResult) -> float:
        """When an answer finished, in seconds since the run started: its recorded
        ``finished_at`` (SPEC §4.1, to the microsecond as records keep it) where the run is on
        that clock, else the loop's own time."""
        if self.started_at is not None and item.times is not None:
            return round(item.times.finished_at - self.started_at, 6)
        return item.done_s

    def closed_by(self, unreplaced: Sequence[ItemResult]) -> LoopRun:
        """This run with its window closed by the first of ``unreplaced`` (one item of each
        answer after which no request was started) to finish, on the answers' own clock."""
        if self.stop_s is None or not unreplaced:
            return self
        return replace(self, closed_s=min(self.finished_s(item) for item in unreplaced))


@dataclass(frozen=True)
class Steady:
    """Throughput over the steady window (or over the whole run when it has none)."""

    items_per_s: float
    output_tokens_per_s: float
    window_s: float
    completions: int
    whole_run: bool  # True: the steady window was empty, the whole run was used
    inside: tuple[ItemResult, ...] = ()  # the answers counted (goodput is judged on them)


def steady_throughput(run: LoopRun, in_flight: int | None = None) -> Steady:
    """The run's steady throughput: one process's window (``steady_window``), or with
    ``--workers`` the processes' aligned windows (``aligned``); never more than ``in_flight``
    items at once can deliver (``servable``)."""
    found = aligned(run) if run.parts else steady_window(run)
    return servable(found, in_flight)


def _edges(run: LoopRun, ok: Sequence[ItemResult]) -> tuple[float, float] | None:
    """(opens, closes): the first answer after the C-th request started, and the window's end;
    None when the run has no steady window."""
    if run.full_s is None or run.stop_s is None:
        return None
    stop_s = run.closed_s if run.closed_s is not None else run.stop_s
    opens = min((d for i in ok if run.full_s <= (d := run.finished_s(i)) <= stop_s), default=None)
    return None if opens is None else (opens, stop_s)


def steady_window(run: LoopRun) -> Steady:
    """Answers that finished in (first answer after full_s, stop_s], over that time; the whole
    run when that window holds none."""
    ok = [i for i in run.items if i.ok]
    edges = _edges(run, ok)
    if edges is not None:
        opens, stop_s = edges
        inside = [i for i in ok if opens < run.finished_s(i) <= stop_s]
        if inside:
            span = stop_s - opens
            tokens = sum(i.completion_tokens for i in inside)
            return Steady(
                len(inside) / span, tokens / span, span, len(inside), False, tuple(inside)
            )
    span = run.total_s
    if span <= 0:
        return Steady(0.0, 0.0, 0.0, len(ok), True)
    tokens = sum(i.completion_tokens for i in ok)
    return Steady(len(ok) / span, tokens / span, span, len(ok), True, tuple(ok))


def aligned(run: LoopRun) -> Steady:
    """``--workers``: over the span every process was steady in (the latest opening to the
    earliest closing), each process's rate from its own first to its last answer in it, summed.
    Counting every answer between edges that belong to different processes over-counts (an
    answer of one process just inside each edge: +1 per window, +12 % at c = 2 on a short run).
    A span that holds under two answers of a process cannot time it: the merged window then."""
    edges = [_edges(part, [i for i in part.items if i.ok]) for part in run.parts]
    if any(e is None for e in edges):
        return steady_window(run)
    low = max(e[0] for e in edges if e is not None)
    high = min(e[1] for e in edges if e is not None)
    if high <= low:
        return steady_window(run)
    insides = [
        sorted(
            (i for i in part.items if i.ok and low <= part.finished_s(i) <= high),
            key=part.finished_s,
        )
        for part in run.parts
    ]
    spans = [
        part.finished_s(inside[-1]) - part.finished_s(inside[0]) if inside else 0.0
        for part, inside in zip(run.parts, insides, strict=True)
    ]
    if min(spans) <= 0:  # a process with under two answers in the shared span: its rate there
        return steady_window(run)  # is unknown, never 0 (a whole level read 0 items/s)
    items_per_s = tokens_per_s = 0.0
    counted: list[ItemResult] = []
    completions = 0
    for inside, span in zip(insides, spans, strict=True):
        items_per_s += (len(inside) - 1) / span
        tokens_per_s += sum(i.completion_tokens for i in inside[1:]) / span
        completions += len(inside) - 1
        counted += inside[1:]
    # the window every figure counted over it is divided by (goodput: the answers that met the
    # SLOs) is the one the summed rate implies, so that a count over it is that rate: over the
    # shared span (high − low) instead, goodput read 6.78 where throughput read 9.57 with every
    # answer within the SLO
    window_s = completions / items_per_s if items_per_s > 0 else high - low
    return Steady(items_per_s, tokens_per_s, window_s, completions, False, tuple(counted))


def servable(found: Steady, in_flight: int | None) -> Steady:
    """Never above what ``in_flight`` items at once can deliver: by Little's law a closed loop
    of N in flight, each answer taking L on average, completes at most N / L per second. A
    reading above that is a counting artefact, not the server (SPEC §5.14)."""
    latencies = [i.elapsed_s for i in found.inside if i.elapsed_s > 0]
    if in_flight is None or not latencies or found.items_per_s <= 0:
        return found
    ceiling = in_flight / (sum(latencies) / len(latencies))
    if found.items_per_s <= ceiling:
        return found
    scale = ceiling / found.items_per_s  # as if the window were that much longer: every
    # figure counted over it (tokens, goodput) shrinks alike and never passes the throughput
    return replace(
        found,
        items_per_s=ceiling,
        output_tokens_per_s=found.output_tokens_per_s * scale,
        window_s=found.window_s / scale,
    )


@dataclass(frozen=True)
class Spread:
    """The median of a level's runs and their lowest and highest."""

    median: float
    low: float
    high: float


def spread(values: Sequence[float]) -> Spread:
    return Spread(statistics.median(values), min(values), max(values))

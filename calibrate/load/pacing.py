"""The load shapes, as pacing policies of the one engine (``load.engine``): when to send.

- ``Wave``: a wave of N released together, at most ``workers`` in flight, all answered before
  the run ends — the ladder's tiers, the determinism copies, the context axis. A failure is
  kept and the wave goes on: the ladder never retries, a failure is information.
- ``Closed``: C kept in flight — each answer replaced at once — until the level's window is
  done (``window.LevelWindow``), then drained; the steady window's edges as ``window.py``
  defines them (full when the C-th request started, closed by the first answer not replaced,
  on the answers' own clock). A failed answer ends the run the same way: more load only adds
  noise.
- ``Open``: request n sent at ``schedule[n]`` whatever the answers (SPEC §5.13), never more than
  ``cap`` in flight: the time a send waited on the cap is counted, and how late each went out.
  A failed answer stops further sends.

Each reads its run back as the stage wants it (``result``); none does I/O or reads a clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from calibrate.load.engine import DONE, SEND, WAIT, Drive, Record, Step, Wait
from calibrate.load.items import ItemResult
from calibrate.load.window import LevelWindow, LoopRun


class Wave:
    """``size`` requests, at most ``workers`` in flight."""

    def __init__(self, size: int, workers: int) -> None:
        self.size = size
        self.workers = max(1, min(workers, size or 1))
        self.sent = 0

    def next(self, now_s: float, in_flight: int) -> Step:
        if self.sent >= self.size:
            return DONE
        if in_flight >= self.workers:
            return WAIT
        self.sent += 1
        return SEND

    def answered(self, record: Record, now_s: float) -> None:
        pass

    def ran_out(self, now_s: float) -> None:
        self.size = self.sent

    def result(self, run: Drive) -> tuple[list[ItemResult], float]:
        """Every item in item order, and the time from the first send to the last answer."""
        return list(run.items), run.total_s


class Closed:
    """``concurrency`` in flight until ``window`` is done or an answer failed."""

    def __init__(self, concurrency: int, window: LevelWindow) -> None:
        self.concurrency = max(1, concurrency)
        self.window = window
        self.started = 0
        self.full_s: float | None = None  # when the C-th request started
        self.stop_s: float | None = None  # when the drain began
        self.unreplaced: list[ItemResult] = []  # an item of each answer not followed by a start
        self._last: tuple[ItemResult, ...] = ()  # the answer just told, until replaced

    def next(self, now_s: float, in_flight: int) -> Step:
        if self.stop_s is None and in_flight >= self.concurrency:
            return WAIT  # the window is asked only when a request could start
        if self.stop_s is None and self.window.done(now_s, self.started):
            self.stop_s = now_s
        if self.stop_s is not None:
            if self._last:
                self.unreplaced.append(self._last[0])
                self._last = ()
            return DONE
        self._last = ()
        self.started += 1
        if self.started == self.concurrency:
            self.full_s = now_s
        return SEND

    def answered(self, record: Record, now_s: float) -> None:
        if self.stop_s is None and not record.ok:
            self.stop_s = now_s
        self._last = record.items

    def ran_out(self, now_s: float) -> None:
        if self.stop_s is None:
            self.stop_s = now_s

    def result(self, run: Drive) -> LoopRun:
        looped = LoopRun(run.items, run.total_s, self.full_s, self.stop_s, run.started_at)
        return looped.closed_by(self.unreplaced)


@dataclass(frozen=True)
class Answer:
    """One request's answer as the rate rules read it (a prompt list of B is one request)."""

    started_s: float
    elapsed_s: float
    ok: bool

    @property
    def done_s(self) -> float:
        return self.started_s + self.elapsed_s

    @classmethod
    def of(cls, items: Sequence[ItemResult]) -> Answer:
        """The request ``items`` came back from: sent at the first's start, done at the last."""
        started = min(i.started_s for i in items)
        return cls(started, max(i.done_s for i in items) - started, all(i.ok for i in items))


@dataclass(frozen=True)
class OpenRun:
    """One open-loop run: every item, and what the dispatcher saw."""

    items: tuple[ItemResult, ...]
    total_s: float
    last_send_s: float  # when the last request went out
    in_flight: tuple[int, ...]  # requests in flight just before each send
    capped_s: float  # time sends waited on the in-flight cap
    lag_s: tuple[float, ...] = ()  # how late each send went out against its schedule
    answers: tuple[Answer, ...] = ()  # one per request (empty: one per item, a request each)

    @property
    def requests(self) -> tuple[Answer, ...]:
        """The answers per request — what a rate in requests/s is measured against."""
        return self.answers or tuple(Answer.of([i]) for i in self.items)


class Open:
    """Request n at ``schedule[n]`` s, at most ``cap`` in flight (None: no cap)."""

    def __init__(self, schedule: Sequence[float], cap: int | None) -> None:
        self.schedule = schedule
        self.cap = cap
        self.sent = 0
        self.failed = False
        self.seen: list[int] = []
        self.lags: list[float] = []
        self.last_send_s = 0.0
        self.capped_s = 0.0
        self._held_s: float | None = None  # when the cap began to hold the next send back

    def next(self, now_s: float, in_flight: int) -> Step:
        if self.failed or self.sent >= len(self.schedule):
            return DONE
        at = self.schedule[self.sent]
        if now_s < at:
            return Wait(at)
        if self.cap is not None and in_flight >= self.cap:
            if self._held_s is None:
                self._held_s = now_s
            return WAIT
        if self._held_s is not None:
            self.capped_s += now_s - self._held_s
            self._held_s = None
        self.seen.append(in_flight)
        self.lags.append(max(0.0, now_s - at))
        self.last_send_s = now_s
        self.sent += 1
        return SEND

    def answered(self, record: Record, now_s: float) -> None:
        self.failed = self.failed or not record.ok

    def ran_out(self, now_s: float) -> None:
        self.schedule = self.schedule[: self.sent]

    def result(self, run: Drive) -> OpenRun:
        answers = tuple(Answer.of(r.items) for r in run.records if r.items)
        return OpenRun(
            run.items,
            run.total_s,
            self.last_send_s,
            tuple(self.seen),
            self.capped_s,
            tuple(self.lags),
            answers,
        )

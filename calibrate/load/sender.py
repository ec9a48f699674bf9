"""What a stage sends load with: the engine (``load.engine``) behind three calls, one per shape.

``send`` a wave (the ladder's tiers, the determinism copies, the context axis), keep C in
flight over a window (``closed_loop``, the sweep and tune), or send on a schedule
(``open_loop``, the sweep's ``--rates``). Each is one ``drive`` under its pacing policy
(``load.pacing``) over this sender's transport, on its clock: the asyncio HTTP transport on the
process's I/O loop (``Sender.over``), or, in the tests, the simulated server on a virtual clock
(``load.sim``). ``--workers N`` runs the same calls in N processes (``load.procs.sender``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from calibrate.http.client import OpenAIClient
from calibrate.load.engine import Drive, Pacing, Record, Step, drive
from calibrate.load.items import ItemResult
from calibrate.load.pacing import Closed, Open, OpenRun, Wave
from calibrate.load.request import Request
from calibrate.load.transport import Clock, HttpTransport, LoopClock, Transport
from calibrate.load.window import LevelWindow, LoopRun


class Sender:
    """Sends load over ``transport`` on ``clock``; ``watch`` sees every record as it comes."""

    def __init__(
        self,
        transport: Transport,
        clock: Clock | None = None,
        watch: Callable[[Record], None] | None = None,
    ) -> None:
        self.transport = transport
        self.clock: Clock = clock or LoopClock()
        self.watch = watch

    @classmethod
    def over(cls, client: OpenAIClient) -> Sender:
        """A sender of completions over ``client`` (the process's I/O loop)."""
        return cls(HttpTransport(client))

    def close(self) -> None:
        """Nothing to end here: every request is sent from this process (``WorkerSender``'s
        worker processes end here)."""

    def workers_mark(self) -> int:
        """Where the worker processes' self-checks so far end (``workers_bound_since``)."""
        return 0

    def workers_bound_since(self, mark: int) -> str:
        """Why a worker process was the client's limit in the runs after ``mark``, or "": one
        process has none (the stage's own self-check watches this one)."""
        return ""

    def run(
        self, source: Iterator[Request], pacing: Pacing, max_tokens: int | None = None
    ) -> Drive:
        """One run of the engine: ``source`` sent as ``pacing`` says."""
        if self.watch is not None:
            pacing = _Watched(pacing, self.watch)
        work = drive(source, pacing, self.transport, self.clock, max_tokens=max_tokens)
        return self.clock.run(work)

    def send(
        self, requests: Sequence[Request], workers: int, max_tokens: int | None = None
    ) -> tuple[list[ItemResult], float]:
        """A wave: all results (in item order) and the wall time from the first send to the
        last answer, at most ``workers`` in flight."""
        wave = Wave(len(requests), workers)
        return wave.result(self.run(iter(requests), wave, max_tokens))

    def closed_loop(
        self,
        supply: Callable[[], Request],
        concurrency: int,
        window: LevelWindow,
        max_tokens: int | None = None,
    ) -> LoopRun:
        """Keep ``concurrency`` requests in flight — each answer's successor from ``supply`` —
        until ``window`` is done or an answer failed, then let those in flight finish."""
        closed = Closed(concurrency, window)
        return closed.result(self.run(_endless(supply), closed, max_tokens))

    def open_loop(
        self,
        requests: Sequence[Request],
        schedule: Sequence[float],
        cap: int | None,
        max_tokens: int | None = None,
    ) -> OpenRun:
        """Send ``requests[n]`` at ``schedule[n]`` s whatever the answers (SPEC §5.13), at most
        ``cap`` in flight, and wait for every answer."""
        pacing = Open(schedule, cap)
        return pacing.result(self.run(iter(requests), pacing, max_tokens))


def _endless(supply: Callable[[], Request]) -> Iterator[Request]:
    while True:
        yield supply()


class _Watched:
    """A policy whose records are also shown to ``watch`` (a worker telling its parent)."""

    def __init__(self, pacing: Pacing, watch: Callable[[Record], None]) -> None:
        self._pacing = pacing
        self._watch = watch

    def next(self, now_s: float, in_flight: int) -> Step:
        return self._pacing.next(now_s, in_flight)

    def answered(self, record: Record, now_s: float) -> None:
        self._watch(record)
        self._pacing.answered(record, now_s)

    def ran_out(self, now_s: float) -> None:
        self._pacing.ran_out(now_s)

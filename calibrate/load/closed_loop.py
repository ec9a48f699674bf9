"""The sweep's closed loop over the asyncio transport: C requests in flight, no thread per slot.

A thread per slot, each handing its request to the I/O loop and woken for the answer, cost about
0.27 ms of CPU per request in hand-offs alone (bench/README.md, threads→raw-asyncio+uvloop). Here
the loop only does I/O and stamps each answer's bytes as they arrive; one helper thread parses
each answer, turns it into items and starts its successor. Under load answers queue up for the
helper and it takes them one after another without sleeping, so the hand-offs are one per burst,
not one per request.

Nothing but I/O runs on the loop on purpose: parsing a streamed answer takes about half a
millisecond, and when C answers end together (a closed loop starts its C requests at once) the
loop would parse them back to back while every other stream's bytes waited to be read — and
stamped late. Measured, c=128 streamed: a loop that parsed doubled the mean TTFT recorded
(16 → 33 ms against a 5 ms server); the helper keeps it where the thread version had it.

What the run records is the thread version's (waves.py): the same items, the window's edges
(``full_s`` when the C-th request started, ``stop_s`` when the window ended or an answer
failed), and a request still unanswered past the bound is a recorded failure, never dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Protocol

from calibrate.http.client import OpenAIClient
from calibrate.http.models import Completion
from calibrate.http.request_times import epoch_at, monotonic
from calibrate.load.items import ItemResult
from calibrate.load.request import Request
from calibrate.load.window import LevelWindow, LoopRun

log = logging.getLogger("calibrate")
HELPER = "calibrate-loop-helper"


class Answers(Protocol):
    """What the run asks of its sender (``waves.Sender``)."""

    client: OpenAIClient
    clock: Callable[[], float]

    def items_of(
        self,
        request: Request,
        started: float,
        done: float,
        sent: float,
        ended: float,
        completion: Completion | None,
        failure: BaseException | None,
        max_tokens: int | None,
    ) -> list[ItemResult]:
        """A request's items: its answer's, or one failed item per prompt (never raises)."""
        ...

    def stuck_items(self, request: Request, t0: float) -> list[ItemResult]:
        """A request never answered, as failed items."""
        ...


class SubmittedLoop:
    """One closed-loop run over the asyncio transport (``Sender.closed_loop``)."""

    def __init__(
        self,
        sender: Answers,
        supply: Callable[[], Request],
        concurrency: int,
        window: LevelWindow,
        max_tokens: int | None,
    ) -> None:
        self._sender = sender
        self._client = sender.client
        self._clock = sender.clock
        self._supply = supply
        self._concurrency = max(1, concurrency)
        self._window = window
        self._max_tokens = max_tokens
        self._lock = threading.Lock()  # the caller's thread (the first C) and the helper
        self._results: list[ItemResult] = []
        self._in_flight: dict[int, Request] = {}
        self._started = 0
        self._full_s: float | None = None
        self._stop_s: float | None = None
        self._unreplaced: list[ItemResult] = []  # an item of each answer not followed by a start
        self._over = threading.Event()
        self._helper: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._start = 0.0

    def run(self) -> LoopRun:
        threading.Thread(target=self._help, name=HELPER, daemon=True).start()
        self._start = self._clock()
        try:
            for _ in range(self._concurrency):
                with self._lock:
                    start = self._next_locked()
                if start is None:
                    break
                self._send(*start)
            self._finish_if_over()
            # The window bounds the loop; this only guards against a request stuck past its
            # timeout (it is then a recorded failure, as in the thread version).
            self._over.wait(self._window.min_s + self._client.timeout_s * 2 + 30)
        finally:
            self._helper.put(None)
        return self._run()

    def _run(self) -> LoopRun:
        start = self._start
        with self._lock:  # stopped by a stuck request: stop_s may be None (as in waves.py)
            results = list(self._results)
            for request in self._in_flight.values():
                results.extend(self._sender.stuck_items(request, start))
            self._in_flight.clear()
            self._over.set()  # late answers change nothing from here on
            items = tuple(sorted(results, key=lambda r: r.index))
            started_at = epoch_at(start) if self._clock is monotonic else None
            run = LoopRun(items, self._clock() - start, self._full_s, self._stop_s, started_at)
            return run.closed_by(self._unreplaced)

    def _next_locked(self) -> tuple[int, Request] | None:
        """The next request to start, numbered; None once the window is over or an answer
        failed. ``supply`` is called here, under the lock: by one thread at a time."""
        now = self._clock() - self._start
        if self._stop_s is not None or self._over.is_set():
            return None
        if self._window.done(now, self._started):
            self._stop_s = now
            return None
        request = self._supply()
        self._started += 1
        self._in_flight[self._started] = request
        if self._started == self._concurrency:
            self._full_s = now
        return self._started, request

    def _send(self, number: int, request: Request) -> None:
        sent, started = monotonic(), self._clock() - self._start

        def done(completion: Completion | None, failure: BaseException | None) -> None:
            at, ended = self._clock() - self._start, monotonic()  # on the helper
            most = self._max_tokens
            self._settle(
                number,
                self._sender.items_of(request, started, at, sent, ended, completion, failure, most),
            )

        try:
            self._client.submit_completion(request.path, request.body, done, self._helper.put)
        except Exception as exc:  # not sent after all: its failure is the answer
            now = self._clock() - self._start
            failed = self._sender.items_of(
                request, started, now, sent, monotonic(), None, exc, self._max_tokens
            )
            self._settle(number, failed)

    def _settle(self, number: int, items: list[ItemResult]) -> None:
        """An answer is in: keep its items, stop on a failure, start the next request."""
        with self._lock:
            if self._over.is_set() or self._in_flight.pop(number, None) is None:
                return  # after the bound (already recorded as stuck)
            self._results.extend(items)
            if self._stop_s is None and any(not i.ok for i in items):
                self._stop_s = self._clock() - self._start  # more load only adds noise
            start = self._next_locked()
            if start is None and items:
                self._unreplaced.append(items[0])
        if start is not None:
            self._send(*start)
        self._finish_if_over()

    def _finish_if_over(self) -> None:
        with self._lock:  # nothing in flight and nothing more to start
            over = not self._in_flight and self._stop_s is not None
        if over:
            self._over.set()

    def _help(self) -> None:
        while (job := self._helper.get()) is not None:
            try:
                job()
            except Exception:  # calibrate's own bug: the run ends instead of waiting for ever
                log.exception("the closed loop's helper failed")
                with self._lock:
                    if self._stop_s is None:
                        self._stop_s = self._clock() - self._start
                self._finish_if_over()


def closed_loop_submitted(
    sender: Answers,
    supply: Callable[[], Request],
    concurrency: int,
    window: LevelWindow,
    max_tokens: int | None,
) -> LoopRun:
    return SubmittedLoop(sender, supply, concurrency, window, max_tokens).run()

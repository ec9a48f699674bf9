"""A wave over the asyncio transport: its requests released together, at most ``workers`` in
flight, all answered before it returns, and no thread per request.

The ladder sends a wave of B (and the determinism copies a wave of K) as one burst. A thread
per request, each handing its request to the I/O loop and woken for its answer, costs a thread
start and two hand-offs per request. Here the caller sends the first ``workers``; each answer
is parsed on one helper thread (the loop only reads and stamps, as in the closed loop), which
keeps its items and sends the next request of the wave. A failure is kept and the wave goes on:
the ladder never retries, a failure is information. A request still unanswered past the bound
is a recorded failure, never dropped (as in the thread version, ``Sender.send``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from queue import SimpleQueue

from calibrate.http.models import Completion
from calibrate.http.request_times import monotonic
from calibrate.load.closed_loop import Answers
from calibrate.load.items import ItemResult
from calibrate.load.request import Request

log = logging.getLogger("calibrate")
HELPER = "calibrate-wave-helper"


class SubmittedWave:
    """One wave over the asyncio transport (``Sender.send``)."""

    def __init__(
        self, sender: Answers, requests: Sequence[Request], workers: int, max_tokens: int | None
    ) -> None:
        self._sender = sender
        self._client = sender.client
        self._clock = sender.clock
        self._requests = requests
        self._workers = max(1, min(workers, len(requests) or 1))
        self._max_tokens = max_tokens
        self._lock = threading.Lock()
        self._slots: list[list[ItemResult] | None] = [None] * len(requests)
        self._next = 0  # the index of the next request to send
        self._left = len(requests)  # requests not yet answered
        self._over = threading.Event()
        self._helper: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._start = 0.0

    def run(self) -> tuple[list[ItemResult], float]:
        """All results (in item order) and the wall time from the first send to the last answer."""
        if not self._requests:
            return [], 0.0
        threading.Thread(target=self._help, name=HELPER, daemon=True).start()
        self._start = self._clock()
        try:
            for _ in range(self._workers):
                index = self._take()
                if index is not None:
                    self._send(index)
            # Every request has the client's timeout; this bound only guards against a request
            # stuck past it (it is then a recorded failure).
            self._over.wait(self._client.timeout_s * 2 + 30)
        finally:
            self._helper.put(None)
        with self._lock:
            self._over.set()  # late answers change nothing from here on
            results: list[ItemResult] = []
            for request, slot in zip(self._requests, self._slots, strict=True):
                results.extend(
                    slot if slot is not None else self._sender.stuck_items(request, self._start)
                )
        return sorted(results, key=lambda r: r.index), self._clock() - self._start

    def _take(self) -> int | None:
        with self._lock:
            if self._next >= len(self._requests) or self._over.is_set():
                return None
            self._next += 1
            return self._next - 1

    def _send(self, index: int) -> None:
        request = self._requests[index]
        sent, started = monotonic(), self._clock() - self._start

        def done(completion: Completion | None, failure: BaseException | None) -> None:
            at, ended = self._clock() - self._start, monotonic()  # on the helper
            most = self._max_tokens
            self._settle(
                index,
                self._sender.items_of(request, started, at, sent, ended, completion, failure, most),
            )

        try:
            self._client.submit_completion(request.path, request.body, done, self._helper.put)
        except Exception as exc:  # not sent after all: its failure is the answer
            now = self._clock() - self._start
            most = self._max_tokens
            self._settle(
                index,
                self._sender.items_of(request, started, now, sent, monotonic(), None, exc, most),
            )

    def _settle(self, index: int, items: list[ItemResult]) -> None:
        """An answer is in: keep its items, send the next request of the wave."""
        with self._lock:
            if self._over.is_set() or self._slots[index] is not None:
                return  # after the bound (already recorded as stuck)
            self._slots[index] = items
            self._left -= 1
            if self._left == 0:
                self._over.set()
                return
        following = self._take()
        if following is not None:
            self._send(following)

    def _help(self) -> None:
        while (job := self._helper.get()) is not None:
            try:
                job()
            except Exception:  # calibrate's own bug: the wave ends now, not at the bound;
                log.exception("the wave's helper failed")  # what is unanswered is recorded
                self._over.set()

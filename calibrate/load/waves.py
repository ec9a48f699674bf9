"""Sending load: a wave (requests released together, all answered before the next) for the
ladder, and a closed loop (C kept in flight until a window ends, then drained) for the sweep.

Every item comes back as an ``ItemResult`` — failures too, with the body that was sent, so an
incident can be written for it. The ladder never retries: a failure is information.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from queue import SimpleQueue

from calibrate.errors import ErrorInfo, RequestError, format_traceback
from calibrate.http.client import OpenAIClient
from calibrate.http.models import Completion, ContextLimit
from calibrate.http.request_times import RequestTimes, epoch_at, monotonic
from calibrate.http.server_context import read_context
from calibrate.load.answers import answer_items, failed_item
from calibrate.load.closed_loop import closed_loop_submitted
from calibrate.load.items import ItemResult
from calibrate.load.open_loop import OpenRun, open_loop
from calibrate.load.request import Request
from calibrate.load.wave_loop import SubmittedWave
from calibrate.load.window import LevelWindow, LoopRun

Clock = Callable[[], float]


def _collect(collected: SimpleQueue[Callable[[], None] | None]) -> None:
    """Runs what the I/O loop handed back (parsing answers, turning them into items, which may
    read the server's context over HTTP: never on the loop), until ``None``."""
    while (work := collected.get()) is not None:
        work()


class Sender:
    """Sends requests with at most ``workers`` in flight and times every item."""

    _context: dict[str, ContextLimit | None] | None = None  # per model, asked once
    _context_lock = threading.Lock()

    def __init__(self, client: OpenAIClient, clock: Clock = time.perf_counter) -> None:
        self.client = client
        self.clock = clock

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

    def send(
        self, requests: Sequence[Request], workers: int, max_tokens: int | None = None
    ) -> tuple[list[ItemResult], float]:
        """All results (in item order) and the wall time from the first send to the last answer.

        The workers are daemon threads pulling the next request under a lock: at most
        ``workers`` in flight, and on Ctrl-C the process exits without waiting for requests
        still on the wire (each would otherwise hold it up to the client's timeout). Over the
        asyncio transport no thread per request: one helper sends the rest (wave_loop.py).
        """
        if self.client.can_submit:
            return SubmittedWave(self, requests, workers, max_tokens).run()
        start = self.clock()
        slots: list[list[ItemResult] | None] = [None] * len(requests)
        lock = threading.Lock()
        cursor = iter(range(len(requests)))

        def work() -> None:
            while True:
                with lock:
                    index = next(cursor, None)
                if index is None:
                    return
                slots[index] = self._one(requests[index], start, max_tokens)

        threads = [
            threading.Thread(target=work, name=f"calibrate-send-{n}", daemon=True)
            for n in range(max(1, min(workers, len(requests) or 1)))
        ]
        for thread in threads:
            thread.start()
        # Every request has the client's timeout; this bound only guards against a stuck worker.
        deadline = time.monotonic() + self.client.timeout_s * 2 + 30
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        results: list[ItemResult] = []
        for request, slot in zip(requests, slots, strict=True):
            results.extend(slot if slot is not None else self.stuck_items(request, start))
        return sorted(results, key=lambda r: r.index), self.clock() - start

    def closed_loop(
        self,
        supply: Callable[[], Request],
        concurrency: int,
        window: LevelWindow,
        max_tokens: int | None = None,
    ) -> LoopRun:
        """Keep ``concurrency`` requests in flight — each worker starts the next from ``supply``
        as soon as its answer is in — until ``window`` is done, then let those in flight finish.
        A failed answer ends the run the same way: the level fails, more load only adds noise.

        Times are on this sender's clock (injectable: the loop is tested with a fake one). Over
        the asyncio transport no thread per slot: one helper starts each answer's successor
        (closed_loop.py).
        """
        if self.client.can_submit:
            return closed_loop_submitted(self, supply, concurrency, window, max_tokens)
        start = self.clock()
        lock = threading.Lock()
        results: list[ItemResult] = []
        in_flight: dict[int, Request] = {}
        state: dict[str, float | None] = {"full_s": None, "stop_s": None}
        unreplaced: list[ItemResult] = []  # an item of each answer not followed by a start
        started = 0

        def work() -> None:
            nonlocal started
            answered: list[ItemResult] = []
            while True:
                with lock:
                    now = self.clock() - start
                    if state["stop_s"] is not None or window.done(now, started):
                        if state["stop_s"] is None:
                            state["stop_s"] = now
                        unreplaced.extend(answered[:1])
                        return
                    request = supply()
                    started += 1
                    number = started
                    in_flight[number] = request
                    if started == concurrency:
                        state["full_s"] = now
                answered = self._one(request, start, max_tokens)
                with lock:
                    results.extend(answered)
                    del in_flight[number]
                    if state["stop_s"] is None and any(not a.ok for a in answered):
                        state["stop_s"] = self.clock() - start

        threads = [
            threading.Thread(target=work, name=f"calibrate-loop-{n}", daemon=True)
            for n in range(max(1, concurrency))
        ]
        for thread in threads:
            thread.start()
        # The window bounds the loop; this only guards against a worker stuck past its timeout.
        deadline = time.monotonic() + window.min_s + self.client.timeout_s * 2 + 30
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with lock:
            for request in in_flight.values():
                results.extend(self.stuck_items(request, start))
            items = tuple(sorted(results, key=lambda r: r.index))
            started_at = epoch_at(start) if self.clock is monotonic else None
            run = LoopRun(items, self.clock() - start, state["full_s"], state["stop_s"], started_at)
            return run.closed_by(unreplaced)

    def open_loop(
        self,
        requests: Sequence[Request],
        schedule: Sequence[float],
        cap: int | None,
        max_tokens: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> OpenRun:
        """Send ``requests[n]`` at ``schedule[n]`` s whatever the answers (SPEC §5.13), at most
        ``cap`` in flight, and wait for every answer (``stages.open_loop``).

        Over the asyncio transport each request is handed to the I/O loop at its time (no
        thread started per send: a send goes out within a millisecond of its schedule at
        1,000 req/s); one collector thread turns the answers into items."""
        join_s = (schedule[-1] if schedule else 0.0) + self.client.timeout_s * 2 + 30
        submit = None
        collected: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        if self.client.can_submit:

            def submit(n: int, t0: float, finish: Callable[[list[ItemResult]], None]) -> None:
                request, sent, started = requests[n], monotonic(), self.clock() - t0

                def done(completion: Completion | None, failure: BaseException | None) -> None:
                    at, ended = self.clock() - t0, monotonic()  # on the collector
                    finish(
                        self.items_of(
                            request, started, at, sent, ended, completion, failure, max_tokens
                        )
                    )

                # parsed on the collector too: the loop only reads and stamps (closed_loop.py)
                self.client.submit_completion(request.path, request.body, done, collected.put)

            threading.Thread(
                target=_collect, args=(collected,), name="calibrate-answers", daemon=True
            ).start()
        try:
            return open_loop(
                lambda n, t0: self._one(requests[n], t0, max_tokens),
                schedule,
                cap,
                clock=self.clock,
                sleep=sleep,
                join_s=join_s,
                unanswered=lambda n, t0: self.stuck_items(requests[n], t0),
                submit_one=submit,
            )
        finally:
            collected.put(None)

    def _one(self, request: Request, t0: float, max_tokens: int | None) -> list[ItemResult]:
        sent = monotonic()  # a failure's times (an answer's own are the client's)
        started = self.clock() - t0
        try:
            completion = self.client.post_completion(request.path, request.body)
        except Exception as exc:  # a RequestError, or a bug of calibrate's own: recorded
            return self.items_of(
                request, started, self.clock() - t0, sent, monotonic(), None, exc, max_tokens
            )
        return self.items_of(
            request, started, self.clock() - t0, sent, monotonic(), completion, None, max_tokens
        )

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
        """A request's items: its answer's, or one failed item per prompt (a failure's times
        are ``sent`` and ``ended`` on the monotonic clock; an answer's own are the client's).
        An answer that cannot be turned into items (calibrate's own bug) is its failure."""
        if completion is not None:
            context = functools.partial(self.server_context, str(request.body.get("model", "")))
            try:
                return answer_items(request, completion, started, done, max_tokens, context)
            except Exception as exc:  # recorded all the same, never a lost request
                failure = exc
        if isinstance(failure, RequestError):
            info, kind = failure.info, failure.exc_type or type(failure).__name__
        else:  # a bug of calibrate's own: recorded, never a lost request
            info = ErrorInfo("internal", f"{type(failure).__name__}: {failure}")
            kind = type(failure).__name__
        times = RequestTimes.of(sent, ended)
        tb = format_traceback(failure) if isinstance(failure, Exception) else None
        return [
            failed_item(request, n, started, done, info, kind, tb, times)
            for n in range(len(request.prompts))
        ]

    def server_context(self, model: str) -> ContextLimit | None:
        """The server's context for one request (``stages.server_context``), read the first
        time an answer is cut short and kept: a cut forced answer is then named with it."""
        with self._context_lock:
            if self._context is None:
                self._context = {}
            if model not in self._context:
                self._context[model] = read_context(self.client, model)
            return self._context[model]

    def stuck_items(self, request: Request, t0: float) -> list[ItemResult]:
        now = self.clock() - t0
        info = ErrorInfo("timeout", f"no answer within {now:.0f} s")
        times = RequestTimes.of(monotonic() - now, monotonic())  # send unknown: the loop's start
        return [
            failed_item(request, n, 0.0, now, info, None, None, times)
            for n in range(len(request.prompts))
        ]

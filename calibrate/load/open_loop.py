"""Open-loop load (SPEC §5.13): requests sent on a schedule whatever the answers (the rules that
read such a run — achieved vs offered rate, over-saturation — are ``stages.measure.saturation``).

The dispatcher sends request n at ``schedule[n]`` seconds (handed to the I/O loop where the client
can, else a thread each), never holding more than ``cap`` in flight (SPEC §5.0: an unmanaged server gets no more at once than the ladder proved);
when the cap holds a request back, the time it waited is counted. A failed answer stops further
sends: more load only adds noise. Clock and sleep are injectable.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from calibrate.load.items import ItemResult

Clock = Callable[[], float]
Sleep = Callable[[float], None]


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


def open_loop(
    send_one: Callable[[int, float], list[ItemResult]],
    schedule: Sequence[float],
    cap: int | None,
    *,
    clock: Clock = time.perf_counter,
    sleep: Sleep = time.sleep,
    join_s: float = 600.0,
    unanswered: Callable[[int, float], list[ItemResult]] | None = None,
    submit_one: Callable[[int, float, Callable[[list[ItemResult]], None]], None] | None = None,
) -> OpenRun:
    """Send request n (``send_one(n, t0)``) at ``schedule[n]`` s after the start, at most ``cap``
    in flight; wait for the answers. ``send_one`` times its items from ``t0``. With
    ``submit_one(n, t0, finish)`` no thread is started per send: it hands the request off and
    returns, and ``finish(items)`` is called (from any thread) once it is answered. A request
    sent but never answered — its worker raised, or was still stuck after ``join_s`` — is never
    dropped: ``unanswered(n, t0)`` stands in for its answer (a recorded failure)."""
    start = clock()
    lock = threading.Condition()
    results: list[ItemResult] = []
    answers: list[Answer] = []
    in_flight = 0
    seen: list[int] = []
    lags: list[float] = []
    capped_s = 0.0
    failed = False
    threads: list[threading.Thread] = []
    sent = settled = 0

    done: set[int] = set()

    def take(n: int, answered: list[ItemResult]) -> None:
        nonlocal failed
        done.add(n)
        results.extend(answered)
        if answered:
            answers.append(Answer.of(answered))
        failed = failed or any(not a.ok for a in answered)

    def finished(n: int, answered: list[ItemResult] | None) -> None:
        nonlocal in_flight, failed, settled
        with lock:
            in_flight -= 1
            settled += 1
            if answered is None:
                failed = True  # a failure: nothing more is sent
            else:
                take(n, answered)
            lock.notify_all()

    def work(n: int) -> None:
        answered: list[ItemResult] | None
        try:
            answered = send_one(n, start)
        except Exception:  # answered by ``unanswered`` below; the slot is freed all the same
            answered = None
        finished(n, answered)

    last_send = 0.0
    for n, at in enumerate(schedule):
        wait = at - (clock() - start)
        if wait > 0:
            sleep(wait)
        with lock:
            if failed:
                break
            if cap is not None and in_flight >= cap:
                held = clock()
                while in_flight >= cap:
                    lock.wait(0.05)
                capped_s += clock() - held
            seen.append(in_flight)
            in_flight += 1
        last_send = clock() - start
        lags.append(max(0.0, last_send - at))
        sent += 1
        if submit_one is not None:
            try:
                submit_one(n, start, functools.partial(finished, n))
            except Exception:  # not sent after all: answered by ``unanswered`` below
                finished(n, None)
            continue
        thread = threading.Thread(target=work, args=(n,), name=f"calibrate-open-{n}", daemon=True)
        threads.append(thread)
        thread.start()
    deadline = time.monotonic() + join_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        while settled < sent and (left_s := deadline - time.monotonic()) > 0:
            lock.wait(min(left_s, 0.5))
        for n in range(sent):
            if n not in done and unanswered is not None:
                take(n, unanswered(n, start))
        items = tuple(sorted(results, key=lambda r: r.index))
        return OpenRun(
            items, clock() - start, last_send, tuple(seen), capped_s, tuple(lags), tuple(answers)
        )

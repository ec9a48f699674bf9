"""The open loop's pacer: when each send goes out, and the threads that send.

A sleep overshoots its deadline by 50–100 µs and more (the kernel's timer slack, then the wait
for the interpreter lock), and a thread started per request adds its own start-up: together
they made sends at 1,000 req/s go out milliseconds late. So the pacer sleeps until shortly
before a slot and spins the rest on the clock (``wait_until``; only while the senders keep
up), then hands the request to a sender thread that is already running and waiting on a queue
(``SenderPool``) — the pacer never waits on the network. While a run is paced, the interpreter
switches threads more often (``fine_switching``): a sender busy in Python code otherwise holds
the lock the pacer needs to wake on time for up to 5 ms. Measured by ``bench/pacing.py``.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from calibrate.load.items import percentile

Clock = Callable[[], float]
Sleep = Callable[[float], None]
SPIN_S = 0.0002  # the last stretch before a slot is spun on the clock, not slept
LATE_S = 0.001  # a send that went out more than this after its slot is counted as late
SWITCH_S = 0.0002  # the interpreter's thread switch interval while a run is paced (default 5 ms)
READY = 8  # pool threads started before the first send, without a cap (more: a thread each)
BURST_S = 0.01  # sends due this close to the first are a burst: a thread each from the start


@dataclass(frozen=True)
class SendLag:
    """How late one run's (or a level's) sends went out against their schedule."""

    p50_s: float
    p99_s: float
    max_s: float
    late: int  # sends that went out more than LATE_S after their slot
    sends: int

    @classmethod
    def of(cls, lags_s: Sequence[float]) -> SendLag | None:
        """The figures of one run's lags (None: nothing was sent)."""
        p50, p99 = percentile(lags_s, 50), percentile(lags_s, 99)
        if p50 is None or p99 is None:
            return None
        return cls(p50, p99, max(lags_s), sum(lag > LATE_S for lag in lags_s), len(lags_s))

    @classmethod
    def worst(cls, runs: Sequence[SendLag | None]) -> SendLag | None:
        """A level's: each figure the worst of its runs', the late sends counted over all."""
        lags = [r for r in runs if r is not None]
        if not lags:
            return None
        p50, p99 = max(r.p50_s for r in lags), max(r.p99_s for r in lags)
        late, sends = sum(r.late for r in lags), sum(r.sends for r in lags)
        return cls(p50, p99, max(r.max_s for r in lags), late, sends)

    def to_json(self) -> dict[str, Any]:
        return {
            "send_lag_p50_s": round(self.p50_s, 6),
            "send_lag_p99_s": round(self.p99_s, 6),
            "send_lag_max_s": round(self.max_s, 6),
            "late_sends": self.late,
        }


def wait_until(target: float, clock: Clock, sleep: Sleep, spin_s: float = SPIN_S) -> None:
    """Return at ``target`` on ``clock``: sleep until ``spin_s`` before it, spin the rest.

    The spin is bounded in real time (at most ``spin_s``), so an injected clock that stands
    still between sleeps cannot hold it forever."""
    wait = target - clock()
    if wait > spin_s:
        sleep(wait - spin_s)
        wait = target - clock()
    if wait > 0:
        end = time.perf_counter() + min(wait, spin_s)
        while clock() < target and time.perf_counter() < end:
            pass


@contextmanager
def fine_switching(interval_s: float = SWITCH_S) -> Iterator[Callable[[bool], None]]:
    """Within the block the interpreter hands its lock between threads every ``interval_s``
    at the latest (a shorter interval already set is kept; restored after). ``fine(False)``
    goes back to the interval set while the senders fall behind: with many requests in flight
    a finer interval only adds hand-offs of the lock they all need."""
    before = sys.getswitchinterval()
    fine_s = min(before, interval_s)

    def fine(on: bool) -> None:
        sys.setswitchinterval(fine_s if on else before)

    fine(True)
    try:
        yield fine
    finally:
        sys.setswitchinterval(before)


def threads_to_start(schedule: Sequence[float], cap: int | None) -> int:
    """Sender threads to start before the first send: one per slot of the cap (no more ever
    run at once), without one ``READY`` or as many as the first burst sends at once."""
    if cap is not None:
        return min(cap, len(schedule))
    burst = sum(1 for at in schedule if at <= schedule[0] + BURST_S) if schedule else 0
    return min(len(schedule), max(READY, burst))


class SenderPool:
    """``ready`` threads that each take a request number from one queue and run ``work`` on it;
    a request handed while none of them waits runs on a thread of its own, started then.

    The pool makes a send a hand-off, not a thread start; the threads of their own keep what
    the dispatcher always did when more is in flight than the pool holds. Such a start waits
    for the new thread to run, so a process short of CPU sends later instead of piling up
    requests it cannot serve (a pool that grew instead reached 2,000 threads at 1,000 req/s on
    a loaded 2-core machine, at 55–80 % of the throughput). ``close`` lets every thread finish."""

    def __init__(self, work: Callable[[int], None], ready: int) -> None:
        self._work = work
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._ready = ready
        self.threads: list[threading.Thread] = []
        for k in range(ready):
            self._start(self._serve, f"calibrate-open-{k}")

    def hand(self, n: int) -> None:
        """Request n to a waiting thread, or to a thread of its own when none waits."""
        with self._lock:
            waiting = self._idle > 0
            self._idle -= waiting
        if waiting:
            self._queue.put(n)
        else:
            self._start(lambda: self._work(n), f"calibrate-open-r{n}")

    @property
    def spin_s(self) -> float:
        """How long the pacer may spin before the next slot: ``SPIN_S`` while a pool thread
        waits (the senders keep up), else none — a spin holds the interpreter lock, and
        senders that fall behind need all of it (on a 2-core machine, a spin every slot at
        1,000 req/s took a fifth of it, and runs reached 800 req/s instead of 1,000)."""
        return SPIN_S if self._idle > 0 else 0.0

    def _start(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            n = self._queue.get()
            if n is None:
                return
            self._work(n)

    def close(self, join_s: float) -> None:
        """Stop every thread once the queue is drained; wait up to ``join_s`` for them."""
        for _ in range(self._ready):
            self._queue.put(None)
        deadline = time.monotonic() + join_s
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

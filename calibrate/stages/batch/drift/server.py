"""The server's own account while a batch runs: its /metrics, read about once a second.

Light on purpose: one GET and one parse, on the drift watch's thread, never on the request
path. What is kept per window is the most the server ran and queued, its fullest KV cache, and
its preemption counter's rise since the batch began — across a restart too: what the old
process counted is kept, and the new one's count, from 0, is added to it; never a negative
rise. A server without /metrics (or without these figures) is asked three times, then no more:
nothing is claimed of what it did not say.

Each reading says what was heard (``Heard``), for the watch to leave its window out: nothing
listening (``down``: the scrape was refused or cut, or a proxy said the server was away), or
another process of the server (``restarted``): a counter — any ``*_total`` series — reading
lower than the scrape before (a counter only ever rises in one process, so a lower one counts
again from 0) — or, where the server says when its process started
(``process_start_time_seconds``), another start — or the batch restarted it (told:
``restarted``). A start seen before again, or (without one) counters that go down again within
a few scrapes, are several processes behind one URL answering in turn, not restarts: from then
on no restart is read from them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from calibrate.errors import RequestError
from calibrate.gpu.engine_metrics import kv_usage, preemptions, queue_depth, running_count
from calibrate.gpu.prometheus import Scrape, parse_prometheus
from calibrate.stages.batch.drift.windows import ServerSeen
from calibrate.stages.batch.sending.outage import OUTAGE_STATUSES

log = logging.getLogger("calibrate")

GIVE_UP_AFTER = 3  # failed or empty scrapes in a row before any answered: no /metrics here
MIXED_WITHIN = 10  # a second restart read from the counters within this many scrapes: mixed
STARTED = "process_start_time_seconds"  # prometheus_client's, where the server exports it

# what a reading heard: figures; nothing (a failed or empty scrape); nothing listening; or
# another process of the server than the reading before
Heard = Literal["answered", "silent", "down", "restarted"]
Counters = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class ServerWatch:
    """Reads the server's figures (``read``) and hands each window its share (``window``)."""

    def __init__(self, fetch: Callable[[], str]) -> None:
        self._fetch = fetch
        self._failures = 0
        self._answered = False
        self._first: float | None = None  # the preemption counter when the batch began
        self._last: float | None = None
        self._before = 0.0  # preemptions counted by the server's processes before a restart
        self._kv: float | None = None
        self._running: float | None = None
        self._queue: float | None = None
        self._percent: set[str] = set()
        self._counters: Counters = {}  # every *_total series of the last scrape that had them
        self._started: float | None = None
        self._starts: list[float] = []  # the start times seen, the last 16
        self._told = False  # the batch restarted the server: the next reading is a new process
        self._scrapes = 0
        self._read_restart_at: int | None = None  # the scrape a restart was last read at
        self.mixed = False  # several processes answer in turn: restarts are not read from it

    @property
    def gone(self) -> bool:
        return not self._answered and self._failures >= GIVE_UP_AFTER

    def restarted(self) -> None:
        """The batch restarted the server (``batch --restart``): its next reading is another
        process, whose counters began at 0 (even one that has counted past the old reading)."""
        self._told = True

    def read(self) -> Heard:
        """One scrape, folded into the window's maxima (a failure is no reading)."""
        if self.gone:
            return "silent"
        try:
            scrape = parse_prometheus(self._fetch())
        except Exception as exc:  # the watch's thread boundary: a failed scrape says nothing
            log.debug("drift: metrics scrape failed: %s", exc)
            self._failures += 1
            return "down" if self._answered and _nobody_there(exc) else "silent"
        counter = preemptions(scrape)
        kv = kv_usage(scrape, percent_metrics=self._percent)
        running, queue = running_count(scrape), queue_depth(scrape)
        if counter is None and kv is None and running is None and queue is None:
            self._failures += 1
            return "silent"
        self._answered = True
        self._scrapes += 1
        restarted = self._another_process(scrape)
        if kv is not None and kv.percent:
            self._percent.add(kv.metric)
        if counter is not None:
            fresh = restarted or (self._last is not None and counter.value < self._last)
            if self._last is not None and self._first is not None and fresh:
                self._before += max(0.0, self._last - self._first)  # the old process's count
                self._first = 0.0  # the new one counts from 0
            self._first = counter.value if self._first is None else self._first
            self._last = counter.value
        self._kv = _most(self._kv, kv.usage if kv else None)
        self._running = _most(self._running, running.value if running else None)
        self._queue = _most(self._queue, queue.value if queue else None)
        return "restarted" if restarted else "answered"

    def _another_process(self, scrape: Scrape) -> bool:
        """Whether ``scrape`` is another process's than the reading before: told so, another
        start time where the server says its start (a start seen before is several processes
        answering in turn), else a counter lower than before (one going down again within
        ``MIXED_WITHIN`` scrapes is taken for the same); never once they were seen mixed."""
        told, self._told = self._told, False
        counters: Counters = {
            (name, s.labels): s.value
            for name, series in scrape.items()
            if name.endswith("_total")
            for s in series
        }
        lower = any(v < self._counters[k] for k, v in counters.items() if k in self._counters)
        self._counters = counters or self._counters
        started = scrape.get(STARTED)
        if started:
            start = started[0].value
            seen = self._started is not None and abs(start - self._started) > 1
            again = seen and any(abs(start - s) <= 1 for s in self._starts)
            self._started = start
            self._starts = [*self._starts[-15:], start]
        else:
            seen, again = lower, False
            if seen and self._read_restart_at is not None:
                again = self._scrapes - self._read_restart_at <= MIXED_WITHIN
            self._read_restart_at = self._scrapes if seen else self._read_restart_at
        if again and not self.mixed:
            self.mixed = True
            log.debug("drift: /metrics of several processes in turn: no restart read from them")
        return told or (seen and not self.mixed)

    def window(self) -> ServerSeen | None:
        """What the server said since the last window (None: nothing); the maxima start over."""
        if not self._answered:
            return None
        rise = None
        if self._first is not None and self._last is not None:
            rise = self._before + max(0.0, self._last - self._first)
        seen = ServerSeen(rise, self._kv, self._running, self._queue)
        self._kv = self._running = self._queue = None
        return seen


def _nobody_there(exc: Exception) -> bool:
    """A scrape refused or cut (nothing listening: the server is down), or a proxy's 502–504."""
    if not isinstance(exc, RequestError):
        return False
    info = exc.info
    return info.kind in ("connect", "reset") or (
        info.kind == "http_5xx" and info.status in OUTAGE_STATUSES
    )


def _most(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    return new if old is None else max(old, new)

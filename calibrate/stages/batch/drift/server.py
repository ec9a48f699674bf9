"""The server's own account while a batch runs: its /metrics, read about once a second.

Light on purpose: one GET and one parse, on the drift watch's thread, never on the request
path. What is kept per window is the most the server ran and queued, its fullest KV cache, and
its preemption counter's rise since the batch began — across a restart too: a counter that
reads lower than before belongs to a new process, counting again from 0, and what the old one
counted is kept. A server without /metrics (or without these figures) is asked three times,
then no more: nothing is claimed of what it did not say.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from calibrate.gpu.engine_metrics import kv_usage, preemptions, queue_depth, running_count
from calibrate.gpu.prometheus import parse_prometheus
from calibrate.stages.batch.drift.windows import ServerSeen

log = logging.getLogger("calibrate")

GIVE_UP_AFTER = 3  # failed or empty scrapes in a row before any answered: no /metrics here


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

    @property
    def gone(self) -> bool:
        return not self._answered and self._failures >= GIVE_UP_AFTER

    def read(self) -> None:
        """One scrape, folded into the window's maxima (a failure is no reading)."""
        if self.gone:
            return
        try:
            scrape = parse_prometheus(self._fetch())
        except Exception as exc:  # the watch's thread boundary: a failed scrape says nothing
            log.debug("drift: metrics scrape failed: %s", exc)
            self._failures += 1
            return
        counter = preemptions(scrape)
        kv = kv_usage(scrape, percent_metrics=self._percent)
        running, queue = running_count(scrape), queue_depth(scrape)
        if counter is None and kv is None and running is None and queue is None:
            self._failures += 1
            return
        self._answered = True
        if kv is not None and kv.percent:
            self._percent.add(kv.metric)
        if counter is not None:
            if self._last is not None and self._first is not None and counter.value < self._last:
                self._before += self._last - self._first  # restarted: its counter begins at 0
                self._first = 0.0
            self._first = counter.value if self._first is None else self._first
            self._last = counter.value
        self._kv = _most(self._kv, kv.usage if kv else None)
        self._running = _most(self._running, running.value if running else None)
        self._queue = _most(self._queue, queue.value if queue else None)

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


def _most(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    return new if old is None else max(old, new)

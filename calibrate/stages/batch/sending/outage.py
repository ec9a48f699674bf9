"""Riding out a server outage: one circuit breaker per endpoint (SPEC §5.9).

A vLLM restart takes a minute; retries with backoff spend an item's three attempts in seven
seconds. So when ``after`` requests in a row fail with an outage kind (refused, reset,
overloaded, 502/503/504), the breaker opens: its endpoint takes no new items, the items that
failed meanwhile go back to the queue (they are not failures, and those attempts do not count),
and one worker probes ``GET /v1/models`` with backoff (1, 2, 4 … 10 s) until it answers, then
the endpoint takes items again. After ``limit_s`` without an answer the endpoint is given up;
when every endpoint is given up the run ends with exit 4 and nothing that never got an answer is
marked failed. A managed server whose process is gone can be restarted (``Restarter``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from calibrate.errors import CalibrateError, ErrorInfo
from calibrate.io.records import utc_now_iso

log = logging.getLogger("calibrate")

State = Literal["up", "down", "gone"]
EventKind = Literal["down", "up", "gave_up", "restart", "restart_failed"]

OUTAGE_STATUSES = frozenset({502, 503, 504})
DEFAULT_OUTAGE_AFTER = 5
DEFAULT_OUTAGE_S = 600.0

# None when the endpoint answered; else what went wrong ("connection refused")
Probe = Callable[[], str | None]
Clock = Callable[[], float]


def is_outage(info: ErrorInfo) -> bool:
    """A failure that says the server is away, not that this item is bad."""
    if info.kind in ("connect", "reset", "overloaded"):
        return True
    return info.kind == "http_5xx" and info.status in OUTAGE_STATUSES


class Requeue(Exception):
    """The endpoint is in an outage: put the item back; ``info`` is the failure, if one."""

    def __init__(self, info: ErrorInfo | None = None) -> None:
        super().__init__(info.message if info else "endpoint down")
        self.info = info


@dataclass(frozen=True)
class Restarted:
    """What a restart did (the event's ``detail``). ``ours`` is False when another process
    sharing the server (another shard) restarted it while this one waited its turn: this
    endpoint's restart count does not count it."""

    detail: str
    ours: bool = True


class Restarter(Protocol):
    """Restarts a managed server whose process is gone (``batch --restart``)."""

    def needed(self) -> bool:
        """True when calibrate manages the server and its process has exited."""
        ...

    def restart(self, stop: threading.Event) -> Restarted | None:
        """Start it again (or wait for the process restarting it) until ready; what was done.
        None: ``stop`` was set (the batch is stopping) before it started anything — a stopped
        batch starts no engine. Raises CalibrateError."""
        ...


@dataclass(frozen=True)
class OutagePolicy:
    after: int = DEFAULT_OUTAGE_AFTER  # outage failures in a row that open the breaker
    limit_s: float = DEFAULT_OUTAGE_S  # how long to wait for the server to answer again
    probe_first_s: float = 1.0
    probe_cap_s: float = 10.0


@dataclass(frozen=True)
class OutageEvent:
    """One line of ``runs/<id>/outages.jsonl``."""

    endpoint: str
    event: EventKind
    ts: str
    down_s: float
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "endpoint": self.endpoint,
            "event": self.event,
            "down_s": round(self.down_s, 3),
            "detail": self.detail,
        }


class Breaker:
    """The outage state of one endpoint, shared by its workers."""

    def __init__(
        self,
        endpoint: str,
        policy: OutagePolicy,
        probe: Probe,
        *,
        restarter: Restarter | None = None,
        on_event: Callable[[OutageEvent], None] = lambda event: None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.policy = policy
        self._probe = probe
        self._restarter = restarter
        self._report = on_event
        self._clock = clock
        self._cond = threading.Condition()
        self.state: State = "up"
        self.consecutive = 0
        self.incidents = 0
        self.restarts = 0
        self.down_total_s = 0.0  # over the outages it came back from or gave up on
        self._down_since = 0.0
        self._gone_at: float | None = None  # when it gave up: the endpoint took nothing since
        self._restarted = False  # in this incident
        self._probing = False

    def _on_event(self, event: OutageEvent) -> None:
        """Tell the caller; a caller that fails (a full disk under outages.jsonl) is logged,
        never raised into the worker that tripped the breaker — that left an item both failed
        and queued again, and the run waiting on it for ever."""
        try:
            self._report(event)
        except Exception:
            log.exception("batch: reporting the outage event %s failed", event.event)

    @property
    def down(self) -> bool:
        return self.state != "up"

    def down_for_s(self) -> float | None:
        """Seconds since the endpoint went down, or None while it is up (or given up)."""
        with self._cond:
            return self._clock() - self._down_since if self.state == "down" else None

    def unavailable_s(self) -> float:
        """Seconds the endpoint took no items so far: its outages, the one it is in, and the
        time since it was given up (``down_total_s`` stops at the give-up)."""
        with self._cond:
            now = self._clock()
            if self.state == "down":
                return self.down_total_s + now - self._down_since
            if self.state == "gone" and self._gone_at is not None:
                return self.down_total_s + now - self._gone_at
            return self.down_total_s

    def note_answer(self) -> None:
        """The server answered (any answer): the run of failures is over."""
        if not self.consecutive:  # the hot path: nothing to reset, no lock taken
            return
        with self._cond:
            if self.state == "up":
                self.consecutive = 0

    def note_failure(self, info: ErrorInfo) -> bool:
        """Count one failed attempt; True when its item goes back to the queue (we are down)."""
        if not is_outage(info):
            self.note_answer()
            return False
        with self._cond:
            if self.state != "up":
                return True
            self.consecutive += 1
            if self.consecutive < self.policy.after:
                return False
            event = self._open(f"{self.consecutive} requests in a row failed: {info.message}")
        self._on_event(event)
        return True

    def trip(self, why: str) -> None:
        """Open the breaker now (an item ran out of retries on a refused connection)."""
        with self._cond:
            if self.state != "up":
                return
            event = self._open(why)
        self._on_event(event)

    def _open(self, why: str) -> OutageEvent:
        self.state = "down"
        self._down_since = self._clock()
        self.incidents += 1
        self._restarted = False
        self._cond.notify_all()
        # said once, by the batch command's "warning: … down" line (the event itself)
        log.debug("%s: server unreachable (%s); pausing its items", self.endpoint, why)
        return self._event("down", 0.0, why)

    def _event(self, kind: EventKind, down_s: float, detail: str) -> OutageEvent:
        return OutageEvent(self.endpoint, kind, utc_now_iso(), down_s, detail)

    def await_up(self, stop: threading.Event, idle: Callable[[], bool]) -> bool:
        """Block while the endpoint is down; True once it is up, False when given up or done.

        One waiting worker probes; the others wait for the outcome. ``idle()`` is True when
        there is no work left anywhere, so nobody waits for a server that is no longer needed.
        """
        if not self.down:  # the hot path: read without the lock (a stale "up" costs one
            return True  # attempt, which finds the breaker open and puts its item back)
        while True:
            with self._cond:
                if self.state == "up":
                    return True
                if self.state == "gone" or stop.is_set() or idle():
                    return False
                if self._probing:
                    self._cond.wait(0.2)
                    continue
                self._probing = True
            try:
                self._probe_until_decided(stop, idle)
            finally:
                with self._cond:
                    self._probing = False
                    self._cond.notify_all()

    def _probe_until_decided(self, stop: threading.Event, idle: Callable[[], bool]) -> None:
        wait_s = self.policy.probe_first_s
        while not stop.is_set() and not idle():
            self._maybe_restart(stop)
            problem = self._probe()
            with self._cond:
                down_s = self._clock() - self._down_since
                if problem is None:
                    self.state, self.consecutive = "up", 0
                    self.down_total_s += down_s
                    event = self._event("up", down_s, "answered again")
                elif down_s >= self.policy.limit_s:
                    self.state = "gone"
                    self.down_total_s += down_s
                    self._gone_at = self._clock()
                    event = self._event(
                        "gave_up",
                        down_s,
                        f"no answer for {down_s:.0f} s "
                        f"(--outage-s {self.policy.limit_s:g}): {problem}",
                    )
                else:
                    event = None
                if event is not None:
                    self._cond.notify_all()
            if event is not None:
                self._on_event(event)
                return
            stop.wait(max(min(wait_s, self.policy.limit_s - down_s), 0.0))
            wait_s = min(wait_s * 2, self.policy.probe_cap_s)

    def _maybe_restart(self, stop: threading.Event) -> None:
        if self._restarter is None or self._restarted or not self._restarter.needed():
            return
        self._restarted = True  # once per incident: a server that dies at once is not looped
        with self._cond:
            down_s = self._clock() - self._down_since
        try:
            started = self._restarter.restart(stop)
        except CalibrateError as exc:
            self._on_event(self._event("restart_failed", down_s, exc.message))
            return
        except Exception as exc:  # not ours to raise into a worker: a failed restart, said
            self._on_event(self._event("restart_failed", down_s, f"{type(exc).__name__}: {exc}"))
            return
        if started is None:  # the batch stopped first: its own lines say so
            return
        self.restarts += started.ours
        self._on_event(self._event("restart", down_s, started.detail))

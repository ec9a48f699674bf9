"""How a batch is stopped, and how it knows that no server was ever there.

``BatchControl`` is the run's stop (take no new items, a grace period for those in flight) and
abandon (stop waiting now), set from the signal handler, the journal's writer or the items'
own outcomes; the first reason given is kept. ``ReachabilityGuard`` ends the run (exit 4) when
the first attempts were all refused and nothing ever answered: then no item is marked failed,
since nothing was there to fail it; and (exit 1) when the server refuses the run's own model
before any item was answered ok: the model is wrong, not the items.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal

from calibrate.errors import ErrorInfo
from calibrate.http.error_kinds import refusal_cause

StopReason = Literal[
    "interrupted",
    "write_error",
    "unreachable",
    "outage",
    "descriptors",
    "other_model",
    "unknown_model",
    "workers",
    "internal",
]

MAX_PROBE_ATTEMPTS = 8  # refused attempts, before any answer, that prove nothing is there


class BatchControl:
    """Stop (take no new items, grace for in-flight ones) and abandon (stop waiting now).

    ``reason`` says why the run stopped early: Ctrl-C, an output that cannot be written, a
    server that never answered, an outage longer than --outage-s, calibrate out of file
    descriptors, (--workers) no worker process left, or calibrate's own bug in the sending
    itself; the first one is kept.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.abandon = threading.Event()
        self._lock = threading.Lock()
        self.reason: StopReason | None = None
        self.detail = ""
        self.served: Callable[[str | None], None] = lambda model: None  # each answer's model

    @property
    def interrupted(self) -> bool:
        return self.reason == "interrupted"

    def request_stop(self) -> None:
        """First Ctrl-C stops; a second one abandons the items still in flight."""
        if self.stop.is_set():
            self.abandon.set()
        self.fail("interrupted", "")

    def fail(self, reason: StopReason, detail: str) -> None:
        """Stop taking items because of ``reason`` (kept unless one was given before)."""
        with self._lock:
            if self.reason is None:
                self.reason, self.detail = reason, detail
        self.stop.set()


class ReachabilityGuard:
    """Ends the run when nothing has ever answered: the first attempts were all refused.

    Until some request gets any answer, ``connect`` failures are not failures of their items:
    nothing was there to fail them. Once anything answered, they are ordinary transient errors.
    Every attempt's outcome is told (``note``) on the I/O loop; a worker process's listener
    sets ``answered`` when another process's server answered.
    """

    def __init__(
        self,
        workers: int,
        on_unreachable: Callable[[str], None],
        on_wrong_model: Callable[[str], None] = lambda detail: None,
    ) -> None:
        self.threshold = max(2, min(workers, MAX_PROBE_ATTEMPTS))
        self._on_unreachable = on_unreachable
        self._on_wrong_model = on_wrong_model
        self.answered = False
        self.served = False  # an item was answered ok (here, or another worker's)
        self.refused = 0

    def note(self, error: ErrorInfo | None) -> None:
        """One attempt ended with ``error`` (None: an answer); refused ones are counted."""
        if error is None or error.kind != "connect":
            self.answered = True
            return
        if self.answered:
            return
        self.refused += 1
        if self.refused == self.threshold:
            self._trip(error.message)

    def gave_up(self, error: ErrorInfo) -> bool:
        """True (and the run ends) for a refused item when nothing has answered yet."""
        if error.kind != "connect" or self.answered:
            return False
        self._trip(error.message)
        return True

    def wrong_model(self, error: ErrorInfo) -> bool:
        """True (and the run ends) for an item the server refused as naming a model it does not
        serve while no item was answered ok yet: every item names the run's model (a Batch API
        line naming another is refused before anything is sent), so the model is wrong, not the
        item, and it is not marked failed. A server that ignores the name (llama.cpp) never
        refuses it."""
        if self.served or error.kind != "http_4xx":
            return False
        if refusal_cause(error) != "unknown_model":
            return False
        self._on_wrong_model(
            f"the server does not serve the model asked for ({error.message}); no item was "
            "marked failed"
        )
        return True

    def _trip(self, message: str) -> None:
        self._on_unreachable(
            f"{message}; the first {self.refused} attempt(s) all failed to connect and nothing "
            "ever answered, so no item was marked failed"
        )

"""A batch's items as a pacing policy of the one engine (``load.engine``): a work queue of C.

One ``ItemPacing`` per endpoint (a lane), all on the process's I/O loop. It sends the next
item whenever one of the lane's C slots is free — an item whose retry is due first, then one
waiting in the queue (queue.py) — and reads every answer back as the item's one line:

- an answer: its line goes to the journal (journal.py), and the item leaves the queue;
- a transient failure (SPEC §5.5): retried after its backoff (``load.retry``); the item keeps
  its slot meanwhile, as a worker sleeping through its backoff did, so an overloaded server
  is not sent more while it asks for less;
- an outage (the breaker opens, outage.py): the item goes back to the queue for any endpoint,
  and that attempt does not count; while the breaker is open, a probe thread asks
  ``GET /v1/models`` and the lane sends nothing;
- a refused connection before anything ever answered: the run ends (exit 4), nothing failed
  (control.py's ``ReachabilityGuard``);
- anything else that goes wrong while reading one item (a bug, text that cannot be stored)
  is that item's recorded ``internal`` failure: an item is never lost silently.

It never blocks the loop: a backlogged journal, an open breaker or an empty queue is a short
``Wait``, which is also how soon a stop (Ctrl-C, from another thread) is seen.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from calibrate.errors import ErrorInfo, RequestError
from calibrate.http.error_kinds import OutOfDescriptors
from calibrate.http.models import Completion
from calibrate.io.tasks import Task
from calibrate.load.answers import output_tokens
from calibrate.load.engine import DONE, WAIT, Record, Send, Step, Wait
from calibrate.load.request import Request
from calibrate.stages.batch.sending.control import BatchControl, ReachabilityGuard
from calibrate.stages.batch.sending.output_line import internal_line, result_line

if TYPE_CHECKING:
    from collections.abc import Sequence

    from calibrate.stages.batch.plan import BatchSpec
    from calibrate.stages.batch.sending.lanes import Lane

log = logging.getLogger("calibrate")

POLL_S = 0.05  # how soon a lane with nothing to send looks again (an item, a probe, a stop)
FIRST_LOOK_S = 0.001  # … the first time the queue was found empty: then twice as long each time
UNREACHABLE = ErrorInfo("connect", "server unreachable")


class Items(Protocol):
    """Where a lane's items come from and go back to (queue.py's ``WorkQueue``, or a worker
    process's ``ParentQueue``)."""

    def idle(self) -> bool: ...

    def take_waiting(self) -> Task | None: ...

    def finished(self, task: Task) -> None: ...

    def put_back_item(self, task: Task) -> bool: ...


class Lines(Protocol):
    """Where an item's line goes (journal.py's ``Journal``, or a worker process's sender)."""

    @property
    def backlogged(self) -> bool: ...

    def record(
        self,
        line: dict[str, object],
        text: str | None,
        tokens: int | None,
        endpoint: str,
        *,
        wait: bool,
    ) -> None: ...


@dataclass(frozen=True)
class Work:
    """What every lane of one batch (or of one worker process) shares: where the items come
    from and their lines go, the run's spec, its stop and its reachability guard."""

    queue: Items
    spec: BatchSpec
    journal: Lines
    control: BatchControl
    guard: ReachabilityGuard


@dataclass
class _Held:
    """One item being worked on: its attempts so far and the kinds of those that failed."""

    task: Task
    attempts: int = 0
    kinds: list[str] = field(default_factory=list)


class ItemPacing:
    """One lane's slots over the engine (``drive(..., itemize=False, keep=False)``)."""

    def __init__(self, lane: Lane, lanes: Sequence[Lane], work: Work) -> None:
        self._lane = lane
        self._label = lane.label  # each line names its endpoint: redacted once, not per item
        self._lanes = lanes
        self._queue = work.queue
        self._spec = work.spec
        self._journal = work.journal
        self._control = work.control
        self._guard = work.guard
        self._rng = random.Random()
        self._held: dict[int, _Held] = {}  # id(request) -> its item, while in flight
        self._due: list[tuple[float, int, _Held]] = []  # retries, by when each is due
        self._order = itertools.count()
        self._probe: threading.Thread | None = None
        self._look_s = FIRST_LOOK_S  # how long to wait before looking for an item again

    @property
    def in_flight(self) -> int:
        """Items of this lane being worked on: sent, or waiting out a retry's backoff."""
        return len(self._held) + len(self._due)

    # -- the engine's questions ------------------------------------------------------------

    def next(self, now_s: float, in_flight: int) -> Step:
        if self._control.stop.is_set():
            self._drop_retries()  # stopped while they waited to retry: the rerun does them
            return DONE
        breaker = self._lane.breaker
        if breaker.down:
            return self._paused(now_s)
        due = self._due
        if due and due[0][0] <= now_s:
            return self._send(heapq.heappop(due)[2], now_s)
        if in_flight + len(due) >= self._lane.concurrency:
            return Wait(due[0][0]) if due else WAIT
        if self._journal.backlogged:
            return Wait(now_s + POLL_S)  # the writer catches up; nothing waits on the loop
        task = self._queue.take_waiting()
        if task is not None:
            if self._control.stop.is_set():
                return DONE  # taken after the stop: it stays for the rerun
            self._look_s = FIRST_LOOK_S
            return self._send(_Held(task), now_s)
        if self._queue.idle() and not due:
            return DONE
        # the feeder is reading the input (the run's start): look again soon, then less often
        # (a long tail of answers with nothing left to send costs few wake-ups)
        look_s, self._look_s = self._look_s, min(self._look_s * 2, POLL_S)
        return Wait(min(now_s + look_s, due[0][0]) if due else now_s + look_s)

    def answered(self, record: Record, now_s: float) -> None:
        held = self._held.pop(id(record.request))
        self._look_s = FIRST_LOOK_S  # it may have been the last: the queue is soon idle
        exchange = record.exchange
        completion = exchange.completion if exchange is not None else None
        failure = exchange.failure if exchange is not None else None
        try:
            if failure is None and completion is not None:
                self._guard.note(None)
                self._guard.served = True
                self._lane.breaker.note_answer()
                self._record(held, completion, None)
            elif isinstance(failure, RequestError):
                self._failed(held, failure.info, now_s)
            elif isinstance(failure, OutOfDescriptors):  # calibrate's own limit: the rerun
                self._control.fail("descriptors", failure.message)
                self._queue.finished(held.task)
            else:  # calibrate's own bug: the item's recorded failure all the same
                self._guard.note(None)
                raise failure or RuntimeError("an exchange with neither answer nor failure")
        except Exception as exc:  # any failure becomes this item's recorded one
            self._internal(held, exc)

    def ran_out(self, now_s: float) -> None:
        """Never asked: every send names its request."""

    # -- an item's way ---------------------------------------------------------------------

    def _send(self, held: _Held, now_s: float) -> Step:
        try:
            path, body = self._spec.request_for(held.task)  # its own request, or its text's
        except Exception as exc:  # an item that cannot be sent is its recorded failure
            self._internal(held, exc)
            return Wait(now_s)  # asked again at once
        request = Request(path, body, (), 0)
        held.attempts += 1
        self._held[id(request)] = held
        return Send(request)

    def _failed(self, held: _Held, info: ErrorInfo, now_s: float) -> None:
        guard, breaker, queue = self._guard, self._lane.breaker, self._queue
        guard.note(info)
        if guard.wrong_model(info):
            queue.finished(held.task)  # the run ends: --model is wrong, not this item
            return
        if breaker.note_failure(info):  # an outage: this attempt does not count
            self._put_back(held, info)
            return
        held.kinds.append(info.kind)
        retry = self._spec.retry
        if retry.should_retry(info, held.attempts):
            at_s = now_s + retry.delay_s(held.attempts, info.retry_after_s, self._rng)
            heapq.heappush(self._due, (at_s, next(self._order), held))
            return
        if guard.gave_up(info):
            queue.finished(held.task)  # nothing ever answered: the run ends, not failed
        elif info.kind == "connect" and queue.put_back_item(held.task):
            # refused to the last retry: the server is away, not this item at fault
            breaker.trip(f"an item's {held.attempts} attempts were all refused: {info.message}")
        else:
            self._record(held, None, info)

    def _put_back(self, held: _Held, info: ErrorInfo | None) -> None:
        """To the queue for any endpoint (it rode out an outage); recorded as failed when it
        has ridden out too many, and not at all when nothing ever answered."""
        if info is not None and self._guard.gave_up(info):
            self._queue.finished(held.task)
        elif not self._queue.put_back_item(held.task):
            self._record(held, None, info or UNREACHABLE)

    def _internal(self, held: _Held, exc: Exception) -> None:
        """``exc`` as the item's recorded ``internal`` failure; if even that cannot be written,
        the item is left without a line (the rerun sends it) and the run goes on."""
        try:
            line = internal_line(held.task, exc, held.attempts)
            self._journal.record(line, None, 0, self._label, wait=False)
        except Exception:
            log.exception("batch: the failure of item %r could not be recorded", held.task.id)
        self._queue.finished(held.task)

    def _record(self, held: _Held, completion: Completion | None, error: ErrorInfo | None) -> None:
        spec, task = self._spec, held.task
        line = result_line(
            task,
            completion,
            error,
            max(held.attempts, 1),
            tuple(held.kinds),
            spec.expect,
            spec.params.max_tokens,
        )
        tokens: int | None = 0
        text = None
        if completion is not None:
            tokens = output_tokens(completion)  # None: the server did not say
            text = completion.text
            self._control.served(completion.served_model)
        self._journal.record(line, text, tokens, self._label, wait=False)
        self._queue.finished(task)

    # -- an endpoint away --------------------------------------------------------------------

    def _paused(self, now_s: float) -> Step:
        """The breaker is open: retries go back to the queue, one thread probes."""
        while self._due:
            self._put_back(heapq.heappop(self._due)[2], None)
        breaker = self._lane.breaker
        if breaker.state == "gone":
            if all(other.breaker.state == "gone" for other in self._lanes):
                total_s = max(other.breaker.down_total_s for other in self._lanes)
                self._control.fail(
                    "outage",
                    f"no server answered for {total_s:.0f} s (--outage-s "
                    f"{breaker.policy.limit_s:g}); items that never got an answer are "
                    "not marked failed",
                )
            return DONE
        if self._queue.idle():
            return DONE  # nothing left for it: nobody waits for a server no longer needed
        if self._probe is None or not self._probe.is_alive():
            self._probe = threading.Thread(
                target=breaker.await_up,
                args=(self._control.stop, self._queue.idle),
                name=f"batch-probe-{self._lane.label}",
                daemon=True,  # a probe past its deadline must not hold the exit
            )
            self._probe.start()
        return Wait(now_s + POLL_S)

    def _drop_retries(self) -> None:
        while self._due:
            self._queue.finished(heapq.heappop(self._due)[2].task)

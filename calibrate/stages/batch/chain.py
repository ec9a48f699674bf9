"""A slot's items sent back to back from the I/O loop, while every answer comes back whole.

A batch slot is a thread, and handing each request to the I/O loop and waking the thread for
its answer costs about 0.27 ms of CPU per request on its own (bench/README.md,
threads→raw-asyncio+uvloop), most of a request's budget. So while things go well a slot's items
never pass through its thread: on the loop, the answer's callback records the item's line and
sends the slot's next item, one already waiting in the queue. The thread wakes only when the
run of answers ends:

- no item is waiting (the input is slow or done): the thread waits for one as before;
- an attempt failed: the ordinary worker path (worker.py) takes the item with its first attempt
  already made — retries, the breaker, putting it back and the reachability guard stay there;
- the endpoint's breaker opened, the journal is backlogged, or the run is stopping.

At most one request per slot is in flight, as on the thread path. Nothing here blocks the loop:
the journal is handed the line without waiting for room, and a backlog ends the run instead.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from calibrate.http.error_kinds import request_error
from calibrate.http.models import Completion
from calibrate.io.tasks import Task
from calibrate.stages.batch.result import result_line

if TYPE_CHECKING:
    from calibrate.stages.batch.journal import Journal
    from calibrate.stages.batch.lanes import Lane
    from calibrate.stages.batch.plan import BatchSpec
    from calibrate.stages.batch.queue import WorkQueue

GRACE_S = 5.0  # past a request's deadline, how long the thread waits on a stuck loop


class Control(Protocol):
    """What a chain reads of the run's control (``worker.BatchControl``)."""

    stop: threading.Event
    served: Callable[[str | None], None]


class Guard(Protocol):
    """What a chain tells the reachability guard (``worker.ReachabilityGuard``)."""

    answered: bool


@dataclass(frozen=True)
class FirstAttempt:
    """How an item's first attempt, made on the loop, ended: its answer or its failure."""

    completion: Completion | None
    failure: BaseException | None

    def result(self) -> Completion:
        """The answer, or the failure raised (as the attempt itself would have)."""
        if self.failure is not None:
            raise self.failure
        assert self.completion is not None
        return self.completion


@dataclass(frozen=True)
class Handoff:
    """An item the thread takes over, with its first attempt already made."""

    task: Task
    first: FirstAttempt


class Chain:
    """One slot's run of items on the loop; ``run`` returns when it ends."""

    def __init__(
        self,
        lane: Lane,
        queue: WorkQueue,
        spec: BatchSpec,
        journal: Journal,
        control: Control,
        guard: Guard,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lane = lane
        self._client = lane.client
        self._queue = queue
        self._spec = spec
        self._journal = journal
        self._control = control
        self._guard = guard
        self._clock = clock
        self._lock = threading.Lock()  # this slot's own: the loop and its thread, never others
        self._ended = threading.Lock()  # held while a run is on the loop
        self._ended.acquire()
        self._over = False
        self._handoff: Handoff | None = None
        self._task: Task | None = None  # the item in flight
        self._deadline = 0.0  # its deadline on this clock

    def run(self, task: Task) -> Handoff | None:
        """Send ``task`` and the items after it from the loop until the run ends; None, or the
        item whose attempt failed (the thread's to handle)."""
        self._over, self._handoff = False, None
        with self._lock:
            self._send(task)
        while not self._ended.acquire(timeout=max(self._deadline + GRACE_S - self._clock(), 0.1)):
            with self._lock:
                if self._over or self._clock() < self._deadline + GRACE_S:
                    continue  # ended meanwhile (the lock is about to be released), or moved on
                assert self._task is not None
                url = self._client.base_url
                stuck = request_error(
                    "timeout", f"no answer from {url} (the I/O loop is stuck)", None
                )
                self._end(Handoff(self._task, FirstAttempt(None, stuck)))
        return self._handoff

    # -- on the loop (and, for the first item, on the slot's thread) -----------------------

    def _send(self, task: Task) -> None:
        """Hand ``task``'s request to the loop (the caller holds ``_lock``)."""
        self._task = task
        self._deadline = self._clock() + self._client.timeout_s
        try:
            path, body = self._spec.request_for(task)  # the item's own request, or its text's
            self._client.submit_completion(path, body, functools.partial(self._answered, task))
        except Exception as exc:  # refused before it was sent (or a bug): the thread's to handle
            self._end(Handoff(task, FirstAttempt(None, exc)))

    def _answered(
        self, task: Task, completion: Completion | None, failure: BaseException | None
    ) -> None:
        with self._lock:
            if self._over:
                return  # the thread gave up on a stuck loop and took the item over
            if failure is not None or completion is None:
                self._end(Handoff(task, FirstAttempt(None, failure)))
                return
            try:
                self._record(task, completion)
            except Exception as exc:  # the thread records it as the item's internal failure
                self._end(Handoff(task, FirstAttempt(None, exc)))
                return
            following = self._next()
            if following is None:
                self._end(None)
            else:
                self._send(following)

    def _record(self, task: Task, completion: Completion) -> None:
        """The item's line, as the worker records an answer at its first attempt."""
        self._guard.answered = True
        self._lane.breaker.note_answer()
        spec = self._spec
        line = result_line(task, completion, None, 1, (), spec.expect, spec.params.max_tokens)
        usage = completion.usage
        tokens = (usage.completion_tokens or 0) if usage is not None else 0
        self._control.served(completion.served_model)
        self._journal.record(line, completion.text, tokens, self._lane.label, wait=False)
        self._queue.finished(task)

    def _next(self) -> Task | None:
        """The slot's next item when one is waiting and nothing calls for the thread."""
        control = self._control
        if control.stop.is_set() or self._lane.breaker.down or self._journal.backlogged:
            return None
        task = self._queue.take_waiting()
        if task is not None and control.stop.is_set():
            return None  # taken after the stop: it stays for the rerun, as on the thread path
        return task

    def _end(self, handoff: Handoff | None) -> None:
        self._over, self._handoff, self._task = True, handoff, None
        self._ended.release()

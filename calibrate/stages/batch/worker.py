"""One batch worker: take an item, send it (with retries), record exactly one line for it.

A worker is a thread boundary. Whatever goes wrong while handling one item (a malformed
answer, text that cannot be stored, a bug, even MemoryError) becomes a recorded failure of that
item, kind ``internal`` with the exception type, and the worker takes the next one: an item is
never lost silently, and the run's verdict counts items (SPEC §5.9, §11).
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from calibrate.errors import ErrorInfo, RequestError
from calibrate.http.error_kinds import OutOfDescriptors
from calibrate.http.models import Completion
from calibrate.io.tasks import Task
from calibrate.load.retry import with_retries
from calibrate.stages.batch.chain import Chain, FirstAttempt
from calibrate.stages.batch.outage import Requeue
from calibrate.stages.batch.result import internal_line, result_line

if TYPE_CHECKING:
    from calibrate.stages.batch.journal import Journal
    from calibrate.stages.batch.lanes import Lane
    from calibrate.stages.batch.plan import BatchSpec
    from calibrate.stages.batch.queue import WorkQueue

T = TypeVar("T")

StopReason = Literal[
    "interrupted", "write_error", "unreachable", "outage", "descriptors", "other_model", "workers"
]

MAX_PROBE_ATTEMPTS = 8  # refused attempts, before any answer, that prove nothing is there


class BatchControl:
    """Stop (take no new items, grace for in-flight ones) and abandon (stop waiting now).

    ``reason`` says why the run stopped early: Ctrl-C, an output that cannot be written, a
    server that never answered, an outage longer than --outage-s, calibrate out of file
    descriptors, or (--workers) no worker process left; the first one is kept.
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
    """Ends the run (exit 4) when nothing has ever answered: the first attempts were all refused.

    Until some request gets any answer, ``connect`` failures are not failures of their items:
    nothing was there to fail them. Once anything answered, they are ordinary transient errors.
    An answer seen elsewhere (chain.py) sets ``answered`` itself: one assignment, no lock.
    """

    def __init__(self, workers: int, on_unreachable: Callable[[str], None]) -> None:
        self.threshold = max(2, min(workers, MAX_PROBE_ATTEMPTS))
        self._on_unreachable = on_unreachable
        self._lock = threading.Lock()
        self.answered = False
        self.refused = 0

    def attempt(self, call: Callable[[], T]) -> T:
        """One attempt of ``call``, noting whether the server answered it."""
        refused: str | None = None
        try:
            return call()
        except RequestError as exc:
            if exc.info.kind == "connect":
                refused = exc.info.message
            raise
        finally:
            self._note(refused)

    def gave_up(self, error: ErrorInfo) -> bool:
        """True (and the run ends) for a refused item when nothing has answered yet."""
        if error.kind != "connect" or self.answered:
            return False
        self._trip(error.message)
        return True

    def _note(self, refused: str | None) -> None:
        if refused is None:  # the hot path: one assignment, no lock
            self.answered = True
            return
        with self._lock:
            if self.answered:
                return
            self.refused += 1
            trip = self.refused >= self.threshold
        if trip:
            self._trip(refused)

    def _trip(self, message: str) -> None:
        self._on_unreachable(
            f"{message}; the first {self.refused} attempt(s) all failed to connect and nothing "
            "ever answered, so no item was marked failed"
        )


class Slot:
    """One worker's own in-flight flag: progress sums them, so no counter is shared."""

    __slots__ = ("busy",)

    def __init__(self) -> None:
        self.busy = False


def in_flight(slots: list[Slot]) -> int:
    return sum(1 for slot in slots if slot.busy)


def work(
    lane: Lane,
    lanes: Sequence[Lane],
    queue: WorkQueue,
    spec: BatchSpec,
    journal: Journal,
    control: BatchControl,
    guard: ReachabilityGuard,
    slot: Slot | None = None,
) -> None:
    """One slot of ``lane`` (pool and worker process alike); when its endpoint was given up
    and no endpoint is left, the run stops."""
    _Worker(lane, queue, spec, journal, control, guard).take_items(slot or Slot())
    if lane.breaker.state == "gone" and all(other.breaker.state == "gone" for other in lanes):
        total_s = max(other.breaker.down_total_s for other in lanes)
        control.fail(
            "outage",
            f"no server answered for {total_s:.0f} s (--outage-s "
            f"{lane.breaker.policy.limit_s:g}); items that never got an answer are "
            "not marked failed",
        )


@dataclass
class _Worker:
    """One slot's loop: what it sends with, where its items come from and its lines go."""

    lane: Lane
    queue: WorkQueue
    spec: BatchSpec
    journal: Journal
    control: BatchControl
    guard: ReachabilityGuard
    rng: random.Random = field(default_factory=random.Random)

    def take_items(self, slot: Slot) -> None:
        """Until the items run out or the run stops.

        The slot's items go back to back from the I/O loop (chain.py) and this thread handles
        only what the chain hands back: a failed attempt's item."""
        lane, queue, control, journal = self.lane, self.queue, self.control, self.journal
        chain = Chain(lane, queue, self.spec, journal, control, self.guard)
        while not control.stop.is_set():  # stopping: items not yet started stay for the rerun
            if not lane.breaker.await_up(control.stop, queue.idle):
                return  # given up (its items go to the other endpoints), stopping, or none left
            journal.make_room()  # a chain that ended on a backlogged journal: wait for it here
            task = queue.take(control.stop)
            if task is None:
                return
            slot.busy = True
            try:
                if (handoff := chain.run(task)) is not None:
                    self.handle(handoff.task, handoff.first)
            finally:
                slot.busy = False

    def handle(self, task: Task, first: FirstAttempt | None = None) -> None:
        """Send ``task`` with retries and record its line (``first``: its first attempt, made)."""
        attempts = 0
        lane, queue, guard, breaker = self.lane, self.queue, self.guard, self.lane.breaker

        def attempt() -> Any:
            nonlocal attempts, first
            call: Callable[[], Completion]
            if first is not None:  # made on the I/O loop already (chain.py)
                call, first = first.result, None
            elif breaker.down:
                raise Requeue  # went down while this item waited to retry
            else:
                call = functools.partial(lane.client.post_completion, path, body)
            attempts += 1
            try:
                value = guard.attempt(call)
            except RequestError as exc:
                if breaker.note_failure(exc.info):
                    raise Requeue(exc.info) from exc
                raise
            breaker.note_answer()
            return value

        try:
            spec = self.spec
            path, body = spec.request_for(task)  # the item's own request, or its text's
            try:
                done = with_retries(attempt, spec.retry, wait=self.control.stop.wait, rng=self.rng)
            except Requeue as requeue:
                if requeue.info is not None and guard.gave_up(requeue.info):
                    queue.finished(task)  # nothing ever answered: the run ends, not failed
                elif not queue.put_back_item(task):
                    unreachable = ErrorInfo("connect", "server unreachable")
                    self.record(task, None, requeue.info or unreachable, attempts, ())
                return
            if done.interrupted:
                queue.finished(task)
                return  # stopped while waiting to retry: the rerun does it
            error = done.error
            if error is not None and guard.gave_up(error):
                queue.finished(task)
                return  # nothing ever answered: not this item's failure
            if error is not None and error.kind == "connect" and queue.put_back_item(task):
                # refused to the last retry: the server is away, not this item at fault
                breaker.trip(
                    f"an item's {done.attempts} attempts were all refused: {error.message}"
                )
                return
            self.record(task, done.value, error, done.attempts, done.errors)
        except OutOfDescriptors as exc:  # calibrate's own limit, not the item's: the rerun does it
            self.control.fail("descriptors", exc.message)
            queue.finished(task)
        except Exception as exc:  # thread boundary: any failure becomes this item's recorded one
            self.journal.record(internal_line(task, exc, attempts), None, 0, lane.label)
            queue.finished(task)

    def record(
        self,
        task: Task,
        completion: Completion | None,
        error: ErrorInfo | None,
        attempts: int,
        retried: tuple[str, ...],
    ) -> None:
        spec = self.spec
        line = result_line(
            task, completion, error, max(attempts, 1), retried, spec.expect, spec.params.max_tokens
        )
        usage = completion.usage if completion is not None else None
        tokens = (usage.completion_tokens or 0) if usage is not None else 0
        if completion is not None:
            self.control.served(completion.served_model)
        text = completion.text if completion is not None else None
        self.journal.record(line, text, tokens, self.lane.label)
        self.queue.finished(task)

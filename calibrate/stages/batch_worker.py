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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from calibrate.client import OpenAIClient
from calibrate.errors import ErrorInfo, RequestError
from calibrate.stages.batch_input import Task
from calibrate.stages.batch_result import Tally, result_line
from calibrate.stages.retry import with_retries

if TYPE_CHECKING:
    from calibrate.stages.batch import BatchSpec

T = TypeVar("T")

StopReason = Literal["interrupted", "write_error", "unreachable"]

MAX_PROBE_ATTEMPTS = 8  # refused attempts, before any answer, that prove nothing is there
MESSAGE_CHARS = 300


class BatchControl:
    """Stop (take no new items, grace for in-flight ones) and abandon (stop waiting now).

    ``reason`` says why the run stopped early: Ctrl-C, an output that cannot be written, or a
    server that never answered; the first reason given is kept.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.abandon = threading.Event()
        self._lock = threading.Lock()
        self.reason: StopReason | None = None
        self.detail = ""

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
        with self._lock:
            if refused is None:
                self.answered = True
                return
            if self.answered:
                return
            self.refused += 1
            trip = self.refused >= self.threshold
        if trip:
            self._trip(refused)

    def _trip(self, message: str) -> None:
        self._on_unreachable(
            f"{message}; the first {self.refused} attempt(s) were all refused and nothing "
            "ever answered, so no item was marked failed"
        )


def internal_line(task: Task, exc: BaseException, attempts: int) -> dict[str, Any]:
    """The failure line of an item whose handling raised ``exc`` (kind ``internal``)."""
    text = str(exc)
    if len(text) > MESSAGE_CHARS:
        text = text[: MESSAGE_CHARS - 1] + "…"
    info = ErrorInfo("internal", f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
    return {"id": task.id, "ok": False, "error": info.to_json(), "attempts": max(attempts, 1)}


def work(
    next_task: Callable[[], Task | None],
    client: OpenAIClient,
    spec: BatchSpec,
    tally: Tally,
    control: BatchControl,
    guard: ReachabilityGuard,
) -> None:
    """The worker loop: until the items run out or the run stops."""
    rng = random.Random()
    while not control.stop.is_set():  # stopping: items not yet started stay for the rerun
        task = next_task()
        if task is None:
            return
        tally.begin()
        try:
            _handle(task, client, spec, tally, control, guard, rng)
        finally:
            tally.end()


def _handle(
    task: Task,
    client: OpenAIClient,
    spec: BatchSpec,
    tally: Tally,
    control: BatchControl,
    guard: ReachabilityGuard,
    rng: random.Random,
) -> None:
    attempts = 0

    def attempt() -> Any:
        nonlocal attempts
        attempts += 1
        return guard.attempt(functools.partial(client.post_completion, "/chat/completions", body))

    try:
        body = client.chat_body(spec.model, task.message(spec.prompt), spec.params)
        attempted = with_retries(attempt, spec.retry, wait=control.stop.wait, rng=rng)
        if attempted.interrupted:
            return  # stopped while waiting to retry: the rerun does it
        if attempted.error is not None and guard.gave_up(attempted.error):
            return  # nothing ever answered: not this item's failure
        completion = attempted.value
        line = result_line(task, completion, attempted.error, attempted.attempts,
                           attempted.errors, spec.expect, spec.params.max_tokens)  # fmt: skip
        usage = completion.usage if completion is not None else None
        tokens = (usage.completion_tokens or 0) if usage is not None else 0
        tally.record(line, completion.text if completion is not None else None, tokens)
    except Exception as exc:  # thread boundary: any failure becomes this item's recorded failure
        tally.record(internal_line(task, exc, attempts), None, 0)

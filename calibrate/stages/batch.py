"""Stage F: the production run — tasks JSONL → results JSONL, concurrent and resumable (SPEC §5.9).

``open_batch`` (batch_plan.py) decides and prepares everything before anything is sent.
``run_batch`` feeds a fixed pool of at most ``concurrency`` worker threads (never more than
items) from the streamed input, so at most that many requests are in flight and memory does not
grow with the file. Each finished item is one line, appended and flushed at once: a kill -9 at
any moment loses only the requests in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path

from calibrate.client import OpenAIClient
from calibrate.errors import CalibrateError
from calibrate.selfload import SelfLoadMonitor
from calibrate.stages.batch_input import Task, read_tasks
from calibrate.stages.batch_plan import (
    DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY,
    BatchPlan,
    BatchSpec,
    open_batch,
    plan_batch,
)
from calibrate.stages.batch_result import BatchProgress, BatchResult, Tally
from calibrate.stages.batch_worker import BatchControl, ReachabilityGuard, work
from calibrate.stages.resume import repair_tail
from calibrate.store import JsonlWriter

__all__ = [  # the stage's public face; plans are made in batch_plan, workers in batch_worker
    "DEFAULT_CONCURRENCY", "MAX_CONCURRENCY", "BatchControl", "BatchPlan", "BatchSpec",
    "open_batch", "plan_batch", "run_batch",
]  # fmt: skip

log = logging.getLogger("calibrate")




class TaskSource:
    """The items this run sends, in input order, handed to workers one at a time.

    Workers pull from the streamed file under a lock (no queue, no feeder thread): an item costs
    no hand-off between threads, and nothing is read ahead of the ``concurrency`` items in flight.
    """

    def __init__(self, plan: BatchPlan) -> None:
        self._items = self._generate(plan)
        self._lock = threading.Lock()
        self._closed = False
        self.handed = 0
        self._cap = plan.to_run
        self.error = ""  # why the input could not be read again, when it could not

    @staticmethod
    def _generate(plan: BatchPlan) -> Generator[Task, None, None]:
        cap, sent = plan.to_run, 0
        skip = plan.done_ids if plan.spec.sample is None else set()
        for task in read_tasks(plan.source_path, plan.spec.input_path):
            if sent >= cap:
                return
            if task.id in skip:
                continue
            sent += 1
            yield task

    def next(self) -> Task | None:
        """The next item, or None when there are no more (or the source was closed)."""
        with self._lock:
            if self._closed:
                return None
            try:
                task = next(self._items, None)
            except (CalibrateError, OSError) as exc:  # the file changed or vanished meanwhile
                self.error = (
                    f"--input could not be read again (did it change during the run?): {exc}"
                )
                task = None
            if task is None:
                if not self.error and self.handed < self._cap:
                    self.error = (f"--input gave only {self.handed} of {self._cap} items when "
                                  "read again (did it change during the run?)")  # fmt: skip
                self._close()
            else:
                self.handed += 1
            return task

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._items.close()


def run_batch(
    plan: BatchPlan,
    client: OpenAIClient,
    out_path: Path,
    *,
    control: BatchControl | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    progress_every_s: float = 5.0,
    monitor: SelfLoadMonitor | None = None,
    warn: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> BatchResult:
    """Send the plan's items through at most ``concurrency`` workers; one line per item."""
    spec = plan.spec
    control = control or BatchControl()
    writer = plan.writer
    if writer is None:  # a plan from plan_batch (--sample, or a caller that holds no lock)
        if plan.scan is not None:
            repair_tail(plan.scan)
        writer = JsonlWriter(out_path, fsync=spec.fsync)
    tally = Tally(writer, sample=bool(spec.sample), expect=spec.expect, max_chars=spec.max_chars,
                  on_write_error=lambda detail: control.fail("write_error", detail))  # fmt: skip
    source = TaskSource(plan)
    count = min(spec.concurrency, max(plan.to_run, 1))  # never a thread without an item
    guard = ReachabilityGuard(
        count, on_unreachable=lambda detail: control.fail("unreachable", detail)
    )
    workers = [
        threading.Thread(
            target=work, args=(source.next, client, spec, tally, control, guard),
            name=f"batch-{n}",
            daemon=True,  # only matters when abandoned: a stuck request must not block exit
        )
        for n in range(count)
    ]  # fmt: skip
    start = clock()
    last_report = start
    told_stop = False

    def tick(force: bool = False) -> None:
        nonlocal last_report, told_stop
        now = clock()
        if monitor is not None and warn is not None and (text := monitor.poll_warning()):
            warn(text)
        if control.interrupted and not told_stop:
            told_stop = force = True  # say at once that we are stopping
        if on_progress is None or (not force and now - last_report < progress_every_s):
            return
        last_report = now
        with tally.lock:
            finished = tally.ok + sum(tally.kinds.values())
            snapshot = BatchProgress(plan.to_run, finished, tally.ok, finished - tally.ok,
                                     tally.in_flight, now - start, control.interrupted)  # fmt: skip
        on_progress(snapshot)

    for worker in workers:
        worker.start()
    try:
        abandoned = _wait(workers, source, control, spec.grace_s, tick, clock)
    finally:
        source.close()
        tally.close()
    tick(force=True)
    elapsed = clock() - start
    return BatchResult(
        total=plan.total, skipped=plan.skipped, to_run=plan.to_run, ok=tally.ok,
        failed_by_kind=dict(tally.kinds), interrupted=control.interrupted, abandoned=abandoned,
        stopped_by=control.reason, stop_detail=control.detail or source.error,
        seconds=elapsed, output_tokens=tally.output_tokens, retried_items=tally.retried,
        attempts=tally.attempts, failures=tuple(tally.failures),
        preamble=(tally.preamble_n, tuple(tally.preamble)),
        too_long=(tally.too_long_n, tuple(tally.too_long)), shapes=tuple(tally.shapes),
        selfload=monitor.report() if monitor is not None else None, out_path=out_path,
    )  # fmt: skip


def _wait(
    workers: list[threading.Thread],
    source: TaskSource,
    control: BatchControl,
    grace_s: float,
    tick: Callable[[], None],
    clock: Callable[[], float],
) -> int:
    """Wait for the workers (a grace period once stopping); return how many were abandoned."""
    deadline: float | None = None
    while True:
        if control.stop.is_set() and deadline is None:
            deadline = clock() + grace_s
            source.close()
        alive = [w for w in workers if w.is_alive()]
        if not alive:
            return 0
        if control.abandon.is_set() or (deadline is not None and clock() >= deadline):
            log.warning("abandoning %d item(s) still in flight", len(alive))
            return len(alive)
        alive[0].join(0.2)  # also how soon a Ctrl-C or a progress line is noticed
        tick()

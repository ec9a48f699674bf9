"""Stage F: the production run — tasks JSONL → results JSONL, concurrent and resumable (SPEC §5.9).

``plan_batch`` validates the input and scans the output before anything is sent (InputError,
exit 2, touches nothing). ``run_batch`` feeds a fixed pool of ``concurrency`` worker threads from
the streamed input through a queue of the same size, so at most that many requests are in
flight and memory does not grow with the file. Each finished item is one line, appended and
flushed at once: a kill -9 at any moment loses only the requests in flight.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.client import OpenAIClient
from calibrate.errors import InputError
from calibrate.records import SamplingParams
from calibrate.selfload import SelfLoadMonitor
from calibrate.stages.batch_input import ItemId, Task, index_input, read_tasks
from calibrate.stages.batch_result import BatchProgress, BatchResult, Tally, result_line
from calibrate.stages.format_check import Expect
from calibrate.stages.resume import OutputScan, end_with_newline, scan_output
from calibrate.stages.retry import RetryPolicy, with_retries
from calibrate.store import JsonlWriter

log = logging.getLogger("calibrate")

DEFAULT_CONCURRENCY = 4


@dataclass(frozen=True)
class BatchSpec:
    input_path: Path
    out_path: Path | None  # None only with ``sample``
    model: str
    params: SamplingParams
    prompt: str = ""
    concurrency: int = 4
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    grace_s: float = 10.0
    fsync: bool = False
    sample: int | None = None
    limit: int | None = None
    max_chars: int | None = None
    expect: Expect = "text"
    allow_foreign: bool = False


@dataclass(frozen=True)
class BatchPlan:
    """What the validation pass and the resume scan found; nothing was written yet."""

    spec: BatchSpec
    total: int
    done_ids: set[ItemId]
    scan: OutputScan | None

    @property
    def skipped(self) -> int:
        return 0 if self.spec.sample else len(self.done_ids)

    @property
    def pending(self) -> int:
        return self.total - self.skipped

    @property
    def to_run(self) -> int:
        cap = self.spec.sample or self.spec.limit
        return min(self.pending, cap) if cap else self.pending


def plan_batch(spec: BatchSpec) -> BatchPlan:
    """Validate the input, scan the output; raise InputError (exit 2) without writing."""
    index = index_input(spec.input_path)
    if spec.sample or spec.out_path is None:
        return BatchPlan(spec, index.count, set(), None)
    scan = scan_output(spec.out_path, index.ids)
    if scan.foreign and not spec.allow_foreign:
        raise InputError(
            f"{spec.out_path} holds {scan.foreign} line(s) that are not items of "
            f"{spec.input_path} ({scan.foreign_example}): a different input file?",
            "Use another --out, or pass --allow-foreign to keep them and append anyway.",
        )
    return BatchPlan(spec, index.count, scan.done, scan)


class BatchControl:
    """Stop (take no new items, grace for in-flight ones) and abandon (stop waiting now)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.abandon = threading.Event()

    def request_stop(self) -> None:
        """First Ctrl-C stops; a second one abandons the items still in flight."""
        if self.stop.is_set():
            self.abandon.set()
        self.stop.set()


class TaskSource:
    """The items this run sends, in input order, handed to workers one at a time.

    Workers pull from the streamed file under a lock (no queue, no feeder thread): an item costs
    no hand-off between threads, and nothing is read ahead of the ``concurrency`` items in flight.
    """

    def __init__(self, plan: BatchPlan) -> None:
        self._items = self._generate(plan)
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    def _generate(plan: BatchPlan) -> Generator[Task, None, None]:
        cap, sent = plan.to_run, 0
        skip = plan.done_ids if plan.spec.sample is None else set()
        for task in read_tasks(plan.spec.input_path):
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
            task = next(self._items, None)
            if task is None:
                self._close()
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
    """Send the plan's items through ``concurrency`` workers; append one line per item."""
    spec = plan.spec
    control = control or BatchControl()
    if plan.scan is not None and plan.scan.needs_newline:
        end_with_newline(out_path)
    writer = JsonlWriter(out_path, fsync=spec.fsync)
    tally = Tally(writer, sample=bool(spec.sample), expect=spec.expect, max_chars=spec.max_chars)
    source = TaskSource(plan)
    workers = [
        threading.Thread(
            target=_worker, args=(source, client, spec, tally, control), name=f"batch-{n}",
            daemon=True,  # only matters when abandoned: a stuck request must not block exit
        )
        for n in range(min(spec.concurrency, max(plan.to_run, 1)))
    ]  # fmt: skip
    start = clock()
    last_report = start
    told_stop = False

    def tick(force: bool = False) -> None:
        nonlocal last_report, told_stop
        now = clock()
        if monitor is not None and warn is not None and (text := monitor.poll_warning()):
            warn(text)
        if control.stop.is_set() and not told_stop:
            told_stop = force = True  # say at once that we are stopping
        if on_progress is None or (not force and now - last_report < progress_every_s):
            return
        last_report = now
        with tally.lock:
            finished = tally.ok + sum(tally.kinds.values())
            snapshot = BatchProgress(plan.to_run, finished, tally.ok, finished - tally.ok,
                                     tally.in_flight, now - start, control.stop.is_set())  # fmt: skip
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
        failed_by_kind=dict(tally.kinds), interrupted=control.stop.is_set(), abandoned=abandoned,
        seconds=elapsed, output_tokens=tally.output_tokens, retried_items=tally.retried,
        attempts=tally.attempts, failures=tuple(tally.failures),
        preamble=(tally.preamble_n, tuple(tally.preamble)),
        too_long=(tally.too_long_n, tuple(tally.too_long)), shapes=tuple(tally.shapes),
        selfload=monitor.report() if monitor is not None else None, out_path=out_path,
    )  # fmt: skip


def _worker(
    source: TaskSource, client: OpenAIClient, spec: BatchSpec, tally: Tally, control: BatchControl
) -> None:
    rng = random.Random()
    while not control.stop.is_set():  # stopping: items not yet started stay for the rerun
        task = source.next()
        if task is None:
            return
        with tally.lock:
            tally.in_flight += 1
        body = client.chat_body(spec.model, task.message(spec.prompt), spec.params)
        call = functools.partial(client.post_completion, "/chat/completions", body)
        attempted = with_retries(call, spec.retry, wait=control.stop.wait, rng=rng)
        if attempted.interrupted:
            with tally.lock:
                tally.in_flight -= 1
            return
        completion = attempted.value
        line = result_line(task, completion, attempted.error, attempted.attempts,
                           attempted.errors, spec.expect, spec.params.max_tokens)  # fmt: skip
        usage = completion.usage if completion is not None else None
        tokens = (usage.completion_tokens or 0) if usage is not None else 0
        tally.finish(line, completion.text if completion is not None else None, tokens)


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

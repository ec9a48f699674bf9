"""Stage F: the production run — tasks JSONL → results JSONL, concurrent and resumable (SPEC §5.9).

``open_batch`` validates the input (a pipe is spooled first), locks the output (one writer per
file), scans it and opens it for appending — all before anything is sent; a problem is an
InputError (exit 2) with the output untouched. ``run_batch`` feeds a fixed pool of at most
``concurrency`` worker threads (never more than items) from the streamed input, so at most that
many requests are in flight and memory does not grow with the file. Each finished item is one
line, appended and flushed at once: a kill -9 at any moment loses only the requests in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from calibrate.client import OpenAIClient
from calibrate.errors import CalibrateError, InputError
from calibrate.ledger import Ledger
from calibrate.records import SamplingParams
from calibrate.selfload import SelfLoadMonitor
from calibrate.stages.batch_input import (
    InputIndex,
    ItemId,
    Task,
    index_input,
    read_tasks,
    readable_twice,
)
from calibrate.stages.batch_result import BatchProgress, BatchResult, Tally
from calibrate.stages.batch_worker import BatchControl, ReachabilityGuard, work
from calibrate.stages.format_check import Expect
from calibrate.stages.resume import (
    OutputScan,
    check_journal,
    check_output_path,
    repair_tail,
    scan_output,
)
from calibrate.stages.retry import RetryPolicy
from calibrate.store import ExclusiveLock, JsonlWriter

log = logging.getLogger("calibrate")

DEFAULT_CONCURRENCY = 4
MAX_CONCURRENCY = 4096  # documented in --help and the README; a thread each, a socket each


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
    input_path: Path | None = None  # what to read: --input, or its spooled copy
    writer: JsonlWriter | None = None  # --out, opened (and locked) by open_batch

    @property
    def source_path(self) -> Path:
        return self.input_path or self.spec.input_path

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


def plan_batch(spec: BatchSpec, input_path: Path | None = None) -> BatchPlan:
    """Validate the input, scan the output; raise InputError (exit 2) without writing.

    ``input_path`` is a readable copy of ``spec.input_path`` (see ``open_batch``).
    """
    return _plan(spec, index_input(input_path or spec.input_path, spec.input_path), input_path)


def _plan(spec: BatchSpec, index: InputIndex, input_path: Path | None) -> BatchPlan:
    if spec.sample or spec.out_path is None:
        return BatchPlan(spec, index.count, set(), None, input_path)
    check_output_path(spec.out_path, spec.input_path)
    scan = scan_output(spec.out_path, index.ids)
    check_journal(scan)
    if scan.foreign and not spec.allow_foreign:
        raise InputError(
            f"{spec.out_path} holds {scan.foreign} line(s) that are not items of "
            f"{spec.input_path} ({scan.foreign_example}): a different input file?",
            "Use another --out, or pass --allow-foreign to keep them and append anyway.",
        )
    return BatchPlan(spec, index.count, scan.done, scan, input_path)


def lock_path(out_path: Path) -> Path:
    """``out.jsonl`` → ``out.jsonl.lock``, beside it."""
    return out_path.with_name(out_path.name + ".lock")


@contextmanager
def open_batch(spec: BatchSpec) -> Iterator[BatchPlan]:
    """The plan with --out locked, repaired and open for appending; released afterwards.

    Order matters: the input is validated before the lock (bad input leaves no trace), the
    output is scanned under the lock (no other run appends meanwhile), and it is opened before
    anything is sent (an unwritable --out is exit 2, not a failure after the run).
    """
    with readable_twice(spec.input_path) as readable:
        index_only = spec.sample is not None or spec.out_path is None
        if index_only:
            yield plan_batch(spec, readable)
            return
        assert spec.out_path is not None
        check_output_path(spec.out_path, spec.input_path)
        index = index_input(readable, spec.input_path)  # before the lock: bad input, no trace
        lock = ExclusiveLock.acquire(lock_path(spec.out_path), f"--out {spec.out_path}")
        try:
            plan = _plan(spec, index, readable)
            assert plan.scan is not None
            writer = _open_output(plan.scan, spec.fsync)
            try:
                yield replace(plan, writer=writer)
            finally:
                writer.close_quietly()
        finally:
            lock.release()


def _open_output(scan: OutputScan, fsync: bool) -> JsonlWriter:
    try:
        repair_tail(scan)
        return JsonlWriter(scan.path, fsync=fsync)
    except OSError as exc:
        raise InputError(
            f"cannot write to --out {scan.path}: {exc.strerror or exc}",
            "Choose a writable place for the results; nothing was sent.",
        ) from exc


def pinned_concurrency(ledger: Ledger, target: str) -> tuple[int, str] | None:
    """The concurrency verified for this target: the latest pin's, else the latest sweep's."""
    for stage, keys in (("pin", ("concurrency", "max_concurrency")),
                        ("sweep", ("recommended_concurrency",))):  # fmt: skip
        entry = ledger.latest(stage, target, passed=True)
        if entry is None:
            continue
        for key in keys:
            value = entry.summary.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
                return value, stage
    return None


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

"""A batch's items sent by the one engine: a drive per endpoint, fed by one queue, written by
one journal.

``run_batch`` drives each endpoint's lane (lanes.py) under its work-queue policy (pacing.py) on
the process's I/O loop: at most the endpoint's concurrency in flight (never more than items),
fed from the streamed input by one feeder thread (queue.py), so memory does not grow with the
file. Each finished item is one line, appended and flushed by the one journal thread before it
is counted (journal.py): a kill -9 at any moment loses only the requests in flight and the
lines not yet written. This thread only shows progress and keeps the stop's grace period: a
first Ctrl-C stops sending and lets what is in flight finish, a second one (or the end of
``grace_s``) abandons it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.http.client import OpenAIClient
from calibrate.load.engine import drive
from calibrate.load.transport import LoopClock
from calibrate.stages.batch.control import BatchControl, ReachabilityGuard
from calibrate.stages.batch.journal import Journal
from calibrate.stages.batch.lanes import Lane, make_lane, report
from calibrate.stages.batch.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.pacing import ItemPacing, Work
from calibrate.stages.batch.plan import BatchPlan
from calibrate.stages.batch.queue import WorkQueue
from calibrate.stages.batch.result import BatchProgress, BatchResult
from calibrate.state.setting import Endpoint

log = logging.getLogger("calibrate")


class RunHooks(TypedDict):
    """What both runners take alike (``run_batch`` here, ``procs.run_workers``): ``**hooks``."""

    control: BatchControl
    on_progress: Callable[[BatchProgress], None]
    progress_every_s: float
    monitor: SelfLoadMonitor
    warn: Callable[[str], None]
    outage: OutagePolicy
    events: list[OutageEvent]


class Sending:
    """The lanes' drives under way on ``clock``'s loop: started, watched, ended."""

    def __init__(self, lanes: Sequence[Lane], work: Work) -> None:
        self.lanes = lanes
        self._control = work.control
        self.policies = [ItemPacing(lane, lanes, work) for lane in lanes]
        self.clock = LoopClock()  # the process's I/O loop: every item is sent from it
        self._future: concurrent.futures.Future[None] | None = None

    @property
    def in_flight(self) -> int:
        """Items being worked on (read from another thread: a progress line's figure)."""
        return sum(p.in_flight for p in self.policies)

    def start(self) -> Sending:
        self._future = self.clock.start(self._drives())
        return self

    async def _drives(self) -> None:
        async with asyncio.TaskGroup() as group:  # a bug in one ends them all
            for lane, pacing in zip(self.lanes, self.policies, strict=True):
                run = drive(iter(()), pacing, lane.transport, self.clock, itemize=False, keep=False)
                group.create_task(run)

    def wait(self, timeout_s: float) -> bool:
        """True once every drive is over. A bug of calibrate's own in one (the policy, not an
        item: an item's is its ``internal`` line) ends them all and stops the run as
        ``internal``: recorded as failed, its unanswered items left to the rerun."""
        assert self._future is not None, "start first"
        try:
            self._future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            return False
        except Exception as exc:
            first = exc.exceptions[0] if isinstance(exc, BaseExceptionGroup) else exc
            log.error("batch: sending the items failed", exc_info=first)
            why = f"calibrate's own error while sending the items: {type(first).__name__}: {first}"
            self._control.fail("internal", why)
        return True

    def abandon(self) -> int:
        """Stop waiting for what is in flight (its requests are cancelled); how many."""
        count = self.in_flight
        if self._future is not None:
            self._future.cancel()
        return count


def run_batch(
    plan: BatchPlan,
    client: OpenAIClient | None,
    out_path: Path,
    *,
    lanes: Sequence[Lane] = (),
    control: BatchControl | None = None,
    on_progress: Callable[[BatchProgress], None] | None = None,
    progress_every_s: float = 5.0,
    monitor: SelfLoadMonitor | None = None,
    warn: Callable[[str], None] | None = None,
    outage: OutagePolicy | None = None,
    events: list[OutageEvent] | None = None,
) -> BatchResult:
    """Send the plan's items through the lanes; one line per item.

    Without ``lanes``, one lane of ``spec.concurrency`` slots on ``client``. ``events`` collects
    the outage events (the caller's list, also written to outages.jsonl by its ``on_event``).
    """
    spec = plan.spec
    control = control or BatchControl()
    outage = outage or OutagePolicy()
    events = events if events is not None else []
    if not lanes:
        assert client is not None, "run_batch needs a client or lanes"
        endpoint = Endpoint(client.base_url, spec.concurrency, "spec")
        lanes = (make_lane(endpoint, client, outage, on_event=events.append),)
    total = sum(min(lane.concurrency, max(plan.to_run, 1)) for lane in lanes)
    journal = Journal.for_plan(
        plan, out_path, total, lambda detail: control.fail("write_error", detail)
    )
    tally = journal.tally
    queue = WorkQueue(plan, total)
    guard = ReachabilityGuard(total, lambda detail: control.fail("unreachable", detail))
    sending = Sending(lanes, Work(queue, spec, journal, control, guard))
    wall = time.perf_counter
    start = wall()
    last_report = start
    told_stop = False

    def tick(force: bool = False) -> None:
        nonlocal last_report, told_stop
        now = wall()
        if monitor is not None and warn is not None and (text := monitor.poll_warning()):
            warn(text)
        if control.interrupted and not told_stop:
            told_stop = force = True  # say at once that we are stopping
        if on_progress is None or (not force and now - last_report < progress_every_s):
            return
        last_report = now
        down = tuple(
            (lane.label, s) for lane in lanes if (s := lane.breaker.down_for_s()) is not None
        )
        ok, failed = tally.ok, tally.failed  # read, not locked: the journal thread counts
        snapshot = BatchProgress(
            plan.to_run,
            ok + failed,
            ok,
            failed,
            sending.in_flight,
            now - start,
            control.interrupted,
            down,
            outage.limit_s,
        )
        on_progress(snapshot)

    try:
        queue.start()
        sending.start()
        abandoned = _wait(sending, queue, control, spec.grace_s, tick)
    finally:
        queue.close()
        journal.close()  # writes every line queued (all of them, unless items were abandoned)
        queue.join()
    tick(force=True)
    elapsed = wall() - start
    reports = tuple(
        report(lane, tally.done_at[lane.label], tally.failed_at[lane.label], elapsed)
        for lane in lanes
    )
    return BatchResult.of(
        plan,
        tally,
        control.reason,
        control.detail or queue.error,
        abandoned=abandoned,
        seconds=elapsed,
        selfload=monitor.report() if monitor is not None else None,
        out_path=out_path,
        endpoints=reports,
        events=events,
    )


def _wait(
    sending: Sending,
    queue: WorkQueue,
    control: BatchControl,
    grace_s: float,
    tick: Callable[[], None],
) -> int:
    """Wait for the drives (a grace period once stopping); return how many items were
    abandoned in flight."""
    deadline: float | None = None
    while True:
        if control.stop.is_set() and deadline is None:
            deadline = time.perf_counter() + grace_s
            queue.close()
        if sending.wait(0.2):  # also how soon a Ctrl-C or a progress line is noticed
            return sending.in_flight  # 0, unless a bug ended the drives with items unanswered
        if control.abandon.is_set() or (deadline is not None and time.perf_counter() >= deadline):
            count = sending.abandon()
            log.warning("abandoning %d item(s) still in flight", count)
            return count
        tick()


@contextlib.contextmanager
def stop_on_signals(control: BatchControl) -> Iterator[None]:
    """Ctrl-C / SIGTERM stop the batch cleanly; a second one abandons what is in flight."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        control.request_stop()

    previous: dict[signal.Signals, Callable[..., Any] | int | None] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def close_later(clients: Sequence[OpenAIClient]) -> None:
    """Close the pooled connections (one per slot: 512 at -c 512) off the path to the summary;
    a daemon thread, so the process never waits for it (the kernel closes what is left)."""

    def close_all() -> None:
        for client in clients:
            with contextlib.suppress(Exception):  # thread boundary: nothing left to tell anyone
                client.close()

    threading.Thread(target=close_all, name="batch-close", daemon=True).start()

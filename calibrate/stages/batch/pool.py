"""The worker pool of a batch: threads over the lanes, fed by one queue, written by one journal.

``run_batch`` runs a fixed pool of worker threads — each endpoint's concurrency (never more
than items) — fed from the streamed input by one feeder thread (queue.py), so at most that
many requests are in flight and memory does not grow with the file. An endpoint in an outage
pauses and its items go back to the queue (outage.py). Each finished item is one line,
appended and flushed by the one journal thread before it is counted (journal.py): a kill -9 at
any moment loses only the requests in flight and the lines not yet written. Nothing on the
per-item path takes a lock that every worker contends for. Over the asyncio transport a slot's
answered items are recorded and followed by the next one on the I/O loop itself (chain.py): its
thread wakes only for what needs it — a failed attempt, an outage, no item waiting.
"""

from __future__ import annotations

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
from calibrate.stages.batch.journal import Journal
from calibrate.stages.batch.lanes import Lane, make_lane, report
from calibrate.stages.batch.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.plan import BatchPlan
from calibrate.stages.batch.queue import WorkQueue
from calibrate.stages.batch.result import BatchProgress, BatchResult
from calibrate.stages.batch.worker import (
    BatchControl,
    ReachabilityGuard,
    Slot,
    in_flight,
    work,
)
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
    clock: Callable[[], float] = time.perf_counter,
) -> BatchResult:
    """Send the plan's items through the lanes' workers; one line per item.

    Without ``lanes``, one lane of ``spec.concurrency`` slots on ``client``. ``events`` collects
    the outage events (the caller's list, also written to outages.jsonl by its ``on_event``).
    """
    spec = plan.spec
    control = control or BatchControl()
    outage = outage or OutagePolicy()
    events = events if events is not None else []
    if not lanes:
        assert client is not None, "run_batch needs a client or lanes"
        endpoint = Endpoint(getattr(client, "base_url", ""), spec.concurrency, "spec")  # fakes too
        lanes = (make_lane(endpoint, client, outage, on_event=events.append),)
    counts = [(lane, min(lane.concurrency, max(plan.to_run, 1))) for lane in lanes]
    total_workers = sum(n for _, n in counts)
    journal = Journal.for_plan(
        plan, out_path, total_workers, lambda detail: control.fail("write_error", detail)
    )
    tally = journal.tally
    queue = WorkQueue(plan, total_workers)
    guard = ReachabilityGuard(
        total_workers, on_unreachable=lambda detail: control.fail("unreachable", detail)
    )
    slots: list[Slot] = []
    workers: list[threading.Thread] = []
    for i, (lane, count) in enumerate(counts):
        for n in range(count):
            slots.append(slot := Slot())
            worker = threading.Thread(
                target=work,
                args=(lane, lanes, queue, spec, journal, control, guard, slot),
                name=f"batch-{i}-{n}",
                daemon=True,  # only matters when abandoned: a stuck request must not block exit
            )
            workers.append(worker)
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
        down = tuple(
            (lane.label, s) for lane in lanes if (s := lane.breaker.down_for_s()) is not None
        )
        ok, failed = tally.ok, tally.failed  # read, not locked: the journal thread counts
        snapshot = BatchProgress(
            plan.to_run,
            ok + failed,
            ok,
            failed,
            in_flight(slots),
            now - start,
            control.interrupted,
            down,
            outage.limit_s,
        )
        on_progress(snapshot)

    try:
        queue.start()
        for worker in workers:
            worker.start()
        abandoned = _wait(workers, queue, control, spec.grace_s, tick, clock)
    finally:
        queue.close()
        journal.close()  # writes every line queued (all of them, unless workers were abandoned)
        queue.join()
    tick(force=True)
    elapsed = clock() - start
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
    workers: list[threading.Thread],
    source: WorkQueue,
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

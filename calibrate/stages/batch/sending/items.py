"""A batch's items sent by the one engine: one run loop, whatever sends them.

``run_items`` is the run: one feeder thread streams the input into one queue (queue.py), so
memory does not grow with the file; one journal thread appends and flushes each finished
item's line before it is counted (journal.py), so a kill -9 at any moment loses only the
requests in flight and the lines not yet written; this thread shows progress and warnings and
keeps the stop's grace period (a first Ctrl-C stops sending and lets what is in flight finish,
a second one, or the end of ``grace_s``, abandons it). What sends is its ``Senders``: in this
process, ``Sending`` drives each endpoint's lane (lanes.py) under its work-queue policy
(pacing.py) on the process's I/O loop, at most the endpoint's concurrency in flight (never more
than items) — ``local_senders``, and ``run_batch`` for a run of lanes alone; over worker
processes, ``procs.run.worker_senders``.
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
from typing import Any, Protocol

from calibrate.gpu.selfload import SelfLoadMonitor, SelfLoadReport
from calibrate.http.client import OpenAIClient
from calibrate.load.engine import drive
from calibrate.load.transport import LoopClock
from calibrate.stages.batch.journal import Journal, Tally
from calibrate.stages.batch.plan import BatchPlan, BatchSpec
from calibrate.stages.batch.result import BatchProgress, BatchResult
from calibrate.stages.batch.sending.control import BatchControl, ReachabilityGuard
from calibrate.stages.batch.sending.lanes import EndpointReport, Lane, make_lane, report
from calibrate.stages.batch.sending.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.sending.pacing import ItemPacing, Work
from calibrate.stages.batch.sending.queue import WorkQueue
from calibrate.state.setting import Endpoint

log = logging.getLogger("calibrate")

POLL_S = 0.2  # how soon a Ctrl-C, an ended sender or a progress line is noticed
BOTTLENECK = "calibrate itself is the bottleneck"  # said once a run, by whichever process


class Sending:
    """The lanes' drives under way on ``clock``'s loop, in this process: started, watched,
    ended (the ``Senders`` of a one-process run, and of each worker process's)."""

    def __init__(self, lanes: Sequence[Lane], work: Work) -> None:
        self.lanes = lanes
        self._control = work.control
        self.policies = [ItemPacing(lane, lanes, work) for lane in lanes]
        self.clock = LoopClock()  # the process's I/O loop: every item is sent from it
        self._future: concurrent.futures.Future[None] | None = None

    def in_flight(self) -> int:
        """Items being worked on (read from another thread: a progress line's figure)."""
        return sum(p.in_flight for p in self.policies)

    def start(self) -> None:
        self._future = self.clock.start(self._drives())

    async def _drives(self) -> None:
        async with asyncio.TaskGroup() as group:  # a bug in one ends them all
            for lane, pacing in zip(self.lanes, self.policies, strict=True):
                run = drive(iter(()), pacing, lane.transport, self.clock, itemize=False, keep=False)
                group.create_task(run)

    def settle(self, timeout_s: float) -> bool:
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

    def stop(self) -> None:
        """Nothing to tell: the policies take no item once the queue is closed."""

    def abandon(self) -> int:
        """Stop waiting for what is in flight (its requests are cancelled); how many."""
        count = self.in_flight()
        if self._future is not None:
            self._future.cancel()
        return count

    def down(self, now_s: float) -> tuple[tuple[str, float], ...]:
        return tuple(
            (lane.label, s) for lane in self.lanes if (s := lane.breaker.down_for_s()) is not None
        )

    def warnings(self) -> list[str]:
        return []

    def close(self) -> None:
        """Nothing left: the drives ended, or were cancelled by ``abandon``."""

    def selfload(self, own: SelfLoadReport | None) -> SelfLoadReport | None:
        return own

    def endpoints(self, tally: Tally, elapsed_s: float) -> tuple[EndpointReport, ...]:
        return tuple(
            report(lane, tally.done_at[lane.label], tally.failed_at[lane.label], elapsed_s)
            for lane in self.lanes
        )


class Senders(Protocol):
    """What sends a run's items, in this process (``Sending``) or in worker processes
    (``procs.run``), as the one run loop (``run_items``) drives it: ``settle`` waits up to
    ``timeout_s`` and is True once the sending is over; ``stop`` is called on every turn once
    stopping (send no new item); ``abandon``, past the grace period, gives up what is in flight
    and says how many items that was; ``down``: the endpoints in an outage and for how long;
    ``warnings``: what to show since last asked; ``close``: the run is ending, whatever
    happened; ``selfload``: this process's self-check (``own``) with the senders' merged in."""

    def start(self) -> None: ...
    def settle(self, timeout_s: float) -> bool: ...
    def stop(self) -> None: ...
    def abandon(self) -> int: ...
    def in_flight(self) -> int: ...
    def down(self, now_s: float) -> tuple[tuple[str, float], ...]: ...
    def warnings(self) -> list[str]: ...
    def close(self) -> None: ...
    def selfload(self, own: SelfLoadReport | None) -> SelfLoadReport | None: ...
    def endpoints(self, tally: Tally, elapsed_s: float) -> tuple[EndpointReport, ...]: ...


SendersOf = Callable[[WorkQueue, Journal, int], Senders]  # from the run's queue, journal, slots


def local_senders(lanes: Sequence[Lane], spec: BatchSpec, control: BatchControl) -> SendersOf:
    """The senders of a run in this process: the lanes' drives (``Sending``)."""

    def sending(queue: WorkQueue, journal: Journal, slots: int) -> Sending:
        guard = ReachabilityGuard(
            slots,
            lambda detail: control.fail("unreachable", detail),
            lambda detail: control.fail("unknown_model", detail),
        )
        return Sending(lanes, Work(queue, spec, journal, control, guard))

    return sending


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
    """Send the plan's items through the lanes, in this process; one line per item.

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
    return run_items(
        plan,
        out_path,
        [lane.endpoint for lane in lanes],
        local_senders(lanes, spec, control),
        control=control,
        on_progress=on_progress,
        progress_every_s=progress_every_s,
        monitor=monitor,
        warn=warn,
        outage=outage,
        events=events,
    )


def run_items(
    plan: BatchPlan,
    out_path: Path,
    endpoints: Sequence[Endpoint],
    senders_of: SendersOf,
    *,
    control: BatchControl,
    on_progress: Callable[[BatchProgress], None] | None,
    progress_every_s: float,
    monitor: SelfLoadMonitor | None,
    warn: Callable[[str], None] | None,
    outage: OutagePolicy,
    events: list[OutageEvent],
    clock: Callable[[], float] = time.perf_counter,
) -> BatchResult:
    """The one run loop, whatever sends: the feeder (queue.py) and the journal (journal.py) of
    the endpoints' slots (at most one per item), the senders ``senders_of`` makes from them,
    progress and warnings shown from this thread, the stop's grace period, and the result."""
    slots = sum(min(e.concurrency, max(plan.to_run, 1)) for e in endpoints)
    journal = Journal.for_plan(
        plan, out_path, slots, lambda detail: control.fail("write_error", detail)
    )
    tally = journal.tally
    queue = WorkQueue(plan, slots)
    senders = senders_of(queue, journal, slots)
    start = clock()
    last_report = start
    told = {"stop": False, "bottleneck": False}

    def tick(force: bool = False) -> None:
        nonlocal last_report
        own = [monitor.poll_warning()] if monitor is not None else []
        for text in [*senders.warnings(), *own]:
            if not text or warn is None:
                continue
            if text.startswith(BOTTLENECK):
                if told["bottleneck"]:
                    continue  # once a run, whichever process said it first
                told["bottleneck"] = True
            warn(text)
        if control.interrupted and not told["stop"]:
            told["stop"] = force = True  # say at once that we are stopping
        now = clock()
        if on_progress is None or (not force and now - last_report < progress_every_s):
            return
        last_report = now
        ok, failed = tally.ok, tally.failed  # read, not locked: the journal thread counts
        snapshot = BatchProgress(
            plan.to_run,
            ok + failed,
            ok,
            failed,
            senders.in_flight(),
            now - start,
            control.interrupted,
            senders.down(now),
            outage.limit_s,
            len(endpoints),
        )
        on_progress(snapshot)

    try:
        queue.start()
        senders.start()
        abandoned = _wait(senders, queue, control, plan.spec.grace_s, tick, clock)
    finally:
        senders.close()  # none is left sending, whatever happened here
        queue.close()
        journal.close()  # writes every line queued (all of them, unless items were abandoned)
        queue.join()
    tick(force=True)
    elapsed = clock() - start
    return BatchResult.of(
        plan,
        tally,
        control.reason,
        control.detail or queue.error,
        abandoned=abandoned,
        seconds=elapsed,
        selfload=senders.selfload(monitor.report() if monitor is not None else None),
        out_path=out_path,
        endpoints=senders.endpoints(tally, elapsed),
        events=events,
    )


def _wait(
    senders: Senders,
    queue: WorkQueue,
    control: BatchControl,
    grace_s: float,
    tick: Callable[[], None],
    clock: Callable[[], float],
) -> int:
    """Until the sending is over (a grace period once stopping); how many items were
    abandoned in flight."""
    deadline: float | None = None
    while True:
        if control.stop.is_set():
            if deadline is None:
                deadline = clock() + grace_s
                queue.close()
            senders.stop()
        if senders.settle(POLL_S):  # also how soon a Ctrl-C or a progress line is noticed
            return senders.in_flight()  # 0, unless a bug ended the sending with items held
        if control.abandon.is_set() or (deadline is not None and clock() >= deadline):
            count = senders.abandon()
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

"""A batch's items sent by the one engine: one run loop, whatever sends them.

``run_items`` is the run: one feeder thread streams the input into one queue (queue.py), so
memory does not grow with the file; one journal thread appends and flushes each finished
item's line before it is counted (journal.py), so a kill -9 at any moment loses only the
requests in flight and the lines not yet written; this thread shows progress and warnings and
keeps the stop's grace period (a first Ctrl-C stops sending and lets what is in flight finish,
a second one, or the end of ``grace_s``, abandons it). What sends is its ``Senders``
(senders.py): in this process, ``Sending`` drives each endpoint's lane — ``local_senders``, and
``run_batch`` for a run of lanes alone; over worker processes, ``workers.worker_senders``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.http.client import OpenAIClient
from calibrate.stages.batch.journal import Journal
from calibrate.stages.batch.plan import BatchPlan
from calibrate.stages.batch.result import BatchProgress, BatchResult
from calibrate.stages.batch.sending.control import BatchControl
from calibrate.stages.batch.sending.lanes import Lane, make_lane
from calibrate.stages.batch.sending.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.sending.queue import WorkQueue
from calibrate.stages.batch.sending.senders import POLL_S, Senders, SendersOf, local_senders
from calibrate.state.setting import Endpoint

log = logging.getLogger("calibrate")

BOTTLENECK = "calibrate itself is the bottleneck"  # said once a run, by whichever process


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
        with heap_frozen():
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


_frozen = [0]  # runs in this process with the heap frozen (a test may run several at once)
_frozen_lock = threading.Lock()


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """The objects alive as the run starts (modules, the parser, the plan: some 45,000) kept
    out of the cyclic garbage collector until it ends (``gc.freeze``): its full collections,
    one every ~70,000 allocations (a few hundred items), went through all of them each time
    (~20 ms of the run's CPU). None of them is garbage the run makes; they go back at its end."""
    with _frozen_lock:
        if _frozen[0] == 0:
            gc.freeze()
        _frozen[0] += 1
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen[0] -= 1
            if _frozen[0] == 0:
                gc.unfreeze()


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

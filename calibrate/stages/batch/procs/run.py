"""``run_workers``: a batch over N worker processes, with the same result as ``run_batch``.

The parent's side of the run: the plan's writer, tally, journal and queue exactly as in the
one-process run (sending.py), the workers' messages turned into journal lines and queue events,
progress and warnings shown from the main thread, and the self-check merged: the warning
fires when any process (a worker, or this one that feeds and journals them) is the limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from calibrate.gpu.selfload import SelfLoadMonitor, SelfLoadReport, tree_cpu, workers_advice
from calibrate.load.procs.pool import cores
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.stages.batch.control import BatchControl
from calibrate.stages.batch.journal import Journal, Tally
from calibrate.stages.batch.lanes import EndpointReport
from calibrate.stages.batch.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.plan import BatchPlan
from calibrate.stages.batch.procs.child import WorkerDone, WorkerSetup
from calibrate.stages.batch.procs.parent import POLL_S, Notes, WorkerProc, WorkerSet, split
from calibrate.stages.batch.queue import WorkQueue
from calibrate.stages.batch.result import BatchProgress, BatchResult
from calibrate.state.setting import Endpoint

BOTTLENECK = "calibrate itself is the bottleneck"
_STATES = {"up": 0, "down": 1, "gone": 2}


def advice(workers: int) -> str:
    """What the self-check tells a run whose worker process (or only process) is the limit."""
    return workers_advice(workers, cores(), "lower -c")


def parent_advice(workers: int) -> str:
    """… and when the parent (one feeder and journal for all workers) is the limit."""
    return (
        f"the parent process that reads --input and writes --out for all {workers} --workers "
        "is the limit, so more workers will not help: lower -c, or run on a faster CPU"
    )


def machine_advice(workers: int) -> str:
    """… and when all of calibrate's processes together take the machine's cores."""
    return (
        f"the parent and its {workers} --workers share this machine's cores with nothing to "
        "spare: run calibrate on another machine than the server, or lower -c"
    )


def run_workers(
    plan: BatchPlan,
    out_path: Path,
    *,
    endpoints: Sequence[Endpoint],
    workers: int,
    client: ClientRecipe,
    control: BatchControl,
    on_progress: Callable[[BatchProgress], None],
    progress_every_s: float,
    monitor: SelfLoadMonitor,
    warn: Callable[[str], None],
    outage: OutagePolicy,
    on_event: Callable[[OutageEvent], None],
    events: list[OutageEvent],
    answered: bool = False,
    server_pids: tuple[int, ...] = (),
    clock: Callable[[], float] = time.perf_counter,
    worker_cpu_limit: float = 0.85,
    machine_cpu_limit: float = 0.85,
) -> BatchResult:
    """Send the plan's items through ``workers`` processes; one line per item, written here.

    ``answered``: a server answered already (the endpoints' fixed-prompt check), so a worker
    whose first attempts are refused waits out an outage rather than ending the run as no
    server; the first ok line tells every worker the same.
    ``server_pids``: the server's processes on this machine, told to every worker so that its
    self-check judges late threads on the parent's rule (the server's cores, not the client's).
    ``worker_cpu_limit``: the workers' self-check threshold (one core is 1.0);
    ``machine_cpu_limit``: all processes together, as a share of the machine's cores.
    """
    spec = plan.spec
    given, endpoints = (
        endpoints,
        [
            Endpoint(e.base_url, min(e.concurrency, max(plan.to_run, 1)), e.concurrency_source)
            for e in endpoints
        ],
    )
    slots = sum(e.concurrency for e in endpoints)
    workers = max(1, min(workers, slots))  # every worker has a slot
    journal = Journal.for_plan(
        plan, out_path, slots, lambda detail: control.fail("write_error", detail)
    )
    tally = journal.tally
    queue = WorkQueue(plan, slots)
    notes = Notes()
    down_since: dict[str, float] = {}

    def on_message(proc: WorkerProc, message: tuple[object, ...]) -> None:
        kind = message[0]
        if kind == "line":
            _, item_id, line, text, tokens, label, model = message
            if model is not None:
                control.served(model)  # type: ignore[arg-type]
            journal.record(line, text, tokens, label)  # type: ignore[arg-type]
            if not procs.answered and isinstance(line, dict) and line.get("ok") is True:
                procs.tell_answered()
            if (task := proc.release(item_id)) is not None:  # type: ignore[arg-type]
                queue.finished(task)
        elif kind in ("finished", "back"):
            if (task := proc.release(message[1])) is not None:  # type: ignore[arg-type]
                queue.finished(task) if kind == "finished" else queue.hand_again(task)
        elif kind == "fail":
            control.fail(message[1], message[2])  # type: ignore[arg-type]
        elif kind == "warn":
            notes.put(str(message[1]))
        elif kind == "event" and isinstance(event := message[1], OutageEvent):
            if event.event == "down":
                down_since.setdefault(event.endpoint, clock())
            elif event.event in ("up", "gave_up"):
                down_since.pop(event.endpoint, None)
            on_event(event)

    setups = [
        WorkerSetup(
            i,
            share,
            client,
            spec,
            outage,
            advice(workers),
            worker_cpu_limit,
            answered,
            server_pids,
        )
        for i, share in enumerate(split(endpoints, workers))
    ]
    procs = WorkerSet(setups, queue, control, on_message, notes.put)
    machine = SelfLoadMonitor(
        cpu_clock=tree_cpu(procs.pids),
        cpu_limit=machine_cpu_limit * cores(),
        lag_limit_s=float("inf"),  # each process's own monitor watches its threads
        advice=machine_advice(workers),
        who=f"calibrate's {workers + 1} processes",
        of_cores=cores(),
    )
    start = clock()
    last_report = start
    told = {"stop": False, "bottleneck": False}

    def tick(force: bool = False) -> None:
        nonlocal last_report
        own = [w for w in (monitor.poll_warning(), machine.poll_warning()) if w]
        for text in [*notes.drain(), *own]:
            if text.startswith(BOTTLENECK):
                if told["bottleneck"]:
                    continue  # once a run, whichever process said it first
                told["bottleneck"] = True
            warn(text)
        if control.interrupted and not told["stop"]:
            told["stop"] = force = True
        now = clock()
        if not force and now - last_report < progress_every_s:
            return
        last_report = now
        down = tuple((label, now - since) for label, since in down_since.items())
        ok, failed = tally.ok, tally.failed
        on_progress(
            BatchProgress(
                plan.to_run,
                ok + failed,
                ok,
                failed,
                min(procs.held(), slots),  # held counts the few sent ahead of a free slot
                now - start,
                control.interrupted,
                down,
                outage.limit_s,
            )
        )

    try:
        queue.start()
        procs.start()
        machine.start()
        abandoned = _wait(procs, queue, control, spec.grace_s, tick, clock)
    finally:
        machine.stop()
        procs.kill_all()  # none is left running, whatever happened here
        queue.close()
        journal.close()
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
        selfload=merged(monitor.report(), procs.reports, machine.report()),
        out_path=out_path,
        endpoints=_reports(given, procs.reports, tally, elapsed),
        events=events,
    )


def _wait(
    procs: WorkerSet,
    queue: WorkQueue,
    control: BatchControl,
    grace_s: float,
    tick: Callable[[], None],
    clock: Callable[[], float],
) -> int:
    """Until every worker has ended, reading their messages; the items still held when the
    grace period ended."""
    deadline: float | None = None
    while True:
        if control.stop.is_set():
            if deadline is None:
                deadline = clock() + grace_s
                queue.close()
            procs.stop_all()  # also one started just before the stop
        if not procs.live():
            if not control.stop.is_set() and not queue.idle():
                control.fail("workers", "no worker process is left to send the items")
            return 0
        if control.abandon.is_set() or (deadline is not None and clock() >= deadline):
            held = procs.held()
            procs.kill_all()
            return held
        procs.read(POLL_S)
        tick()


def merged(
    own: SelfLoadReport, workers: Sequence[WorkerDone], machine: SelfLoadReport | None = None
) -> SelfLoadReport:
    """One self-check for the run: the busiest process's figures; a bottleneck if any process
    was one, or all of them together took the machine (``machine``: its reason only)."""
    reports = [own, *(w.selfload for w in workers)]
    if machine is not None and machine.bottleneck:
        reports.append(replace(machine, cpu_fraction_max=0.0, cpu_fraction_mean=0.0))
    reason = next((r.reason for r in reports if r.bottleneck), "")
    return SelfLoadReport(
        windows=max(r.windows for r in reports),
        cpu_fraction_max=max(r.cpu_fraction_max for r in reports),
        cpu_fraction_mean=max(r.cpu_fraction_mean for r in reports),
        lag_max_s=max(r.lag_max_s for r in reports),
        bottleneck=bool(reason),
        reason=reason,
    )


def _reports(
    endpoints: Sequence[Endpoint], done: Sequence[WorkerDone], tally: Tally, elapsed_s: float
) -> tuple[EndpointReport, ...]:
    """Each endpoint as every worker's breaker saw it: the worst state, the longest outage."""
    out = []
    for e in endpoints:
        stats = [s for w in done for s in w.lanes if s.label == e.label]
        out.append(
            EndpointReport(
                e.label,
                e.concurrency,
                e.concurrency_source,
                tally.done_at[e.label],
                tally.failed_at[e.label],
                elapsed_s,
                max((s.state for s in stats), key=_STATES.__getitem__, default="up"),
                max((s.incidents for s in stats), default=0),
                max((s.down_total_s for s in stats), default=0.0),
                sum(s.restarts for s in stats),
            )
        )
    return tuple(out)

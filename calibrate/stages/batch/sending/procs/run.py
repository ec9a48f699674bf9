"""``worker_senders``: a batch over N worker processes, with the same result as in one.

The run loop is the one-process run's (``sending.run_items``: the feeder, the journal, the
progress, the grace period); what is the workers' own is their ``Senders`` (``WorkerSending``):
their messages turned into journal lines and queue events, and the self-check merged — the
warning fires when any process (a worker, or this one that feeds and journals them) is the
limit, or all of them together take the machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from calibrate.gpu.selfload import SelfLoadReport
from calibrate.load.procs import selfcheck
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.load.procs.selfcheck import (
    DEFAULT_LIMITS,
    MACHINE_SHARE,
    CheckLimits,
    machine_check,
    merged,
)
from calibrate.stages.batch.journal import Journal, Tally
from calibrate.stages.batch.plan import BatchPlan
from calibrate.stages.batch.sending.control import BatchControl
from calibrate.stages.batch.sending.lanes import EndpointReport
from calibrate.stages.batch.sending.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.sending.procs.child import WorkerDone, WorkerSetup
from calibrate.stages.batch.sending.procs.parent import Notes, WorkerProc, WorkerSet, split
from calibrate.stages.batch.sending.queue import WorkQueue
from calibrate.stages.batch.sending.senders import SendersOf
from calibrate.state.setting import Endpoint

_STATES = {"up": 0, "down": 1, "gone": 2}
INSTEAD = "lower -c"  # the self-check's advice when no more processes would help


def advice(workers: int) -> str:
    """What the self-check tells a run whose worker process (or only process) is the limit."""
    return selfcheck.worker_advice(workers, INSTEAD)


def parent_advice(workers: int) -> str:
    """… and when the parent (one feeder and journal for all workers) is the limit."""
    return selfcheck.parent_advice(
        workers, "reads --input and writes --out for", f"{INSTEAD}, or run on a faster CPU"
    )


def worker_senders(
    plan: BatchPlan,
    endpoints: Sequence[Endpoint],
    workers: int,
    client: ClientRecipe,
    control: BatchControl,
    outage: OutagePolicy,
    on_event: Callable[[OutageEvent], None],
    *,
    answered: bool = False,
    server_pids: tuple[int, ...] = (),
    limits: CheckLimits = DEFAULT_LIMITS,
    machine_share: float = MACHINE_SHARE,
    clock: Callable[[], float] = time.perf_counter,
) -> SendersOf:
    """The senders of a run over ``workers`` processes, for ``sending.run_items``: each process
    gets its share of every endpoint's slots and sends; every line is written by this one.

    ``answered``: a server answered already (the endpoints' fixed-prompt check), so a worker
    whose first attempts are refused waits out an outage rather than ending the run as no
    server; the first ok line tells every worker the same.
    ``server_pids``: the server's processes on this machine, told to every worker so that its
    self-check judges late threads on the parent's rule (the server's cores, not the client's).
    ``limits``: the workers' self-check thresholds; ``machine_share``: all processes together,
    as a share of the machine's cores (``selfcheck``: the ladder's and sweep's rule too).
    """
    shares = [
        Endpoint(e.base_url, min(e.concurrency, max(plan.to_run, 1)), e.concurrency_source)
        for e in endpoints
    ]
    workers = max(1, min(workers, sum(e.concurrency for e in shares)))  # each has a slot
    setups = [
        WorkerSetup(
            i,
            share,
            client,
            plan.spec,
            outage,
            advice(workers),
            limits,
            answered,
            server_pids,
        )
        for i, share in enumerate(split(shares, workers))
    ]

    def worker_set(queue: WorkQueue, journal: Journal, slots: int) -> WorkerSending:
        return WorkerSending(
            setups, endpoints, slots, queue, journal, control, on_event, machine_share, clock
        )

    return worker_set


class WorkerSending:
    """The ``Senders`` of a run over worker processes: their messages turned into journal lines
    and queue events, their warnings and outages told, the machine-wide self-check beside them,
    and their reports merged at the end."""

    def __init__(
        self,
        setups: Sequence[WorkerSetup],
        endpoints: Sequence[Endpoint],
        slots: int,
        queue: WorkQueue,
        journal: Journal,
        control: BatchControl,
        on_event: Callable[[OutageEvent], None],
        machine_share: float,
        clock: Callable[[], float],
    ) -> None:
        self._endpoints, self._slots, self._clock = endpoints, slots, clock
        self._queue, self._journal, self._control = queue, journal, control
        self._on_event = on_event
        self._notes = Notes()
        self._down_since: dict[str, float] = {}
        self.procs = WorkerSet(setups, queue, control, self._on_message, self._notes.put)
        self._machine = machine_check(self.procs.pids, len(setups), INSTEAD, machine_share)

    def _on_message(self, proc: WorkerProc, message: tuple[object, ...]) -> None:
        kind, queue = message[0], self._queue
        if kind == "line":
            _, item_id, line, text, tokens, label, model = message
            if model is not None:
                self._control.served(model)  # type: ignore[arg-type]
            self._journal.record(line, text, tokens, label)  # type: ignore[arg-type]
            if not self.procs.answered and isinstance(line, dict) and line.get("ok") is True:
                self.procs.tell_answered()
            if (task := proc.release(item_id)) is not None:  # type: ignore[arg-type]
                queue.finished(task)
        elif kind in ("finished", "back"):
            if (task := proc.release(message[1])) is not None:  # type: ignore[arg-type]
                queue.finished(task) if kind == "finished" else queue.hand_again(task)
        elif kind == "fail":
            self._control.fail(message[1], message[2])  # type: ignore[arg-type]
        elif kind == "warn":
            self._notes.put(str(message[1]))
        elif kind == "event" and isinstance(event := message[1], OutageEvent):
            if event.event == "down":
                self._down_since.setdefault(event.endpoint, self._clock())
            elif event.event in ("up", "gave_up"):
                self._down_since.pop(event.endpoint, None)
            self._on_event(event)

    def start(self) -> None:
        self.procs.start()
        self._machine.start()

    def settle(self, timeout_s: float) -> bool:
        """True once every worker has ended; else their next messages, read and acted on."""
        if not self.procs.live():
            if not self._control.stop.is_set() and not self._queue.idle():
                self._control.fail("workers", "no worker process is left to send the items")
            return True
        self.procs.read(timeout_s)
        return False

    def stop(self) -> None:
        self.procs.stop_all()  # also one started just before the stop

    def abandon(self) -> int:
        held = self.procs.held()
        self.procs.kill_all()
        return held

    def in_flight(self) -> int:
        return min(self.procs.held(), self._slots)  # held counts the few sent ahead of a slot

    def down(self, now_s: float) -> tuple[tuple[str, float], ...]:
        return tuple((label, now_s - since) for label, since in self._down_since.items())

    def warnings(self) -> list[str]:
        return [*self._notes.drain(), *filter(None, [self._machine.poll_warning()])]

    def close(self) -> None:
        self._machine.stop()
        self.procs.kill_all()  # none is left running, whatever happened

    def selfload(self, own: SelfLoadReport | None) -> SelfLoadReport | None:
        if own is None:
            return None
        workers = [w.selfload for w in self.procs.reports]
        return merged(own, workers, self._machine.report())

    def endpoints(self, tally: Tally, elapsed_s: float) -> tuple[EndpointReport, ...]:
        return _reports(self._endpoints, self.procs.reports, tally, elapsed_s)


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

"""``batch --workers N``: the items sent by N worker processes, journaled by this one.

The parent stays the only reader of --input (the feeder), the only writer of --out (the journal)
and the only one that counts items; the run loop is the one-process run's (``items.run_items``).
Each worker process (``load.procs.pool``, running ``worker.py``'s job) gets its share of every
endpoint's slots and items from the one ``WorkQueue`` on credit: at most its slots and as many
again ahead (up to 64), topped up by the run's one thread, which also reads its messages — a
finished line is journaled, then its item leaves the queue and its credit is free again; an item
put back (an outage) is handed out again. An item counts as done only once its line is
written, so a kill -9 of anything loses at most what was in flight: a dead worker's unanswered
items go back to the queue and a replacement starts (up to ``MAX_REPLACEMENTS`` in a run; with
none left the others go on, and when none is left the run stops, exit 1, resumable). Stopping
(Ctrl-C, a failed write, an unreachable server) tells every worker to stop; past the grace
period they are killed, and none is replaced. The self-check warns when any process (a worker,
or this one) is the limit, or all of them together take the machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from calibrate.gpu.selfload import SelfLoadReport
from calibrate.load.procs import selfcheck
from calibrate.load.procs.pool import ENDED, WorkerPool
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.load.procs.selfcheck import DEFAULT_LIMITS, MACHINE_SHARE, CheckLimits
from calibrate.load.procs.worker_count import workers_for
from calibrate.stages.batch.journal import Journal, Tally
from calibrate.stages.batch.plan import BatchPlan
from calibrate.stages.batch.sending.control import BatchControl
from calibrate.stages.batch.sending.credit import WorkerProc, feed
from calibrate.stages.batch.sending.lanes import EndpointReport
from calibrate.stages.batch.sending.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.sending.queue import WorkQueue
from calibrate.stages.batch.sending.senders import SendersOf
from calibrate.stages.batch.sending.worker import (
    INSTEAD,
    WorkerDone,
    WorkerSetup,
    advice,
    endpoint_reports,
    split,
)
from calibrate.state.setting import Endpoint

MAX_REPLACEMENTS = 8  # workers started again in one run, at most (a crash loop ends)


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
    """The senders of a run over ``workers`` processes, for ``items.run_items``: each process
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
    workers = workers_for(workers, sum(e.concurrency for e in shares))  # each has a slot
    setups = [
        WorkerSetup(
            i, share, client, plan.spec, outage, advice(workers), limits, answered, server_pids
        )
        for i, share in enumerate(split(shares, workers))
    ]

    def worker_set(queue: WorkQueue, journal: Journal, slots: int) -> WorkerSet:
        return WorkerSet(
            setups, endpoints, slots, queue, journal, control, on_event, machine_share, clock
        )

    return worker_set


class WorkerSet:
    """The ``Senders`` of a run over worker processes (one ``WorkerPool``), started, fed,
    read and replaced: their messages turned into journal lines and queue events, their
    warnings and outages told, the machine-wide self-check beside them, and their reports
    merged at the end. Their messages are read by the run's one thread (``settle``), which also
    hands them items (``credit.feed``: whenever a message or the queue's ``ready`` wakes it) and
    starts the replacements."""

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
        self._setups, self._endpoints, self._slots = list(setups), endpoints, slots
        self._clock = clock
        self._queue, self._journal, self._control = queue, journal, control
        self._on_event = on_event
        self._notes: list[str] = []  # warnings to show, read and shown on the run's thread
        self._down_since: dict[str, float] = {}
        self._replacements = 0
        self._closing = False
        self._pool = WorkerPool("batch-worker")
        queue.ready = self._pool.wake
        self.procs: list[WorkerProc] = []  # by the workers' index: the live one, or its last
        self.reports: list[WorkerDone] = []
        self.answered = any(s.answered for s in self._setups)
        self._machine = selfcheck.machine_check(
            self._pool.pids, len(setups), INSTEAD, machine_share
        )

    # -- the Senders of run_items (senders.py) -----------------------------------------------

    def start(self) -> None:
        for setup in self._setups:
            self._start(setup)
        self._machine.start()
        feed(self.live(), self._queue, self._control.stop.is_set())

    def settle(self, timeout_s: float) -> bool:
        """True once every worker has ended; else their next messages, read and acted on, and
        items handed to those with room for them."""
        if not self.live():
            if not self._control.stop.is_set() and not self._queue.idle():
                self._control.fail("workers", "no worker process is left to send the items")
            return True
        self._read(timeout_s)
        feed(self.live(), self._queue, self._control.stop.is_set())
        return False

    def stop(self) -> None:
        for proc in self.live():  # also one started just before the stop
            if not proc.told_stop:
                proc.told_stop = True
                proc.send(("stop",))

    def abandon(self) -> int:
        held = self._held()
        self._kill()
        return held

    def in_flight(self) -> int:
        return min(self._held(), self._slots)  # held counts the few sent ahead of a slot

    def down(self, now_s: float) -> tuple[tuple[str, float], ...]:
        return tuple((label, now_s - since) for label, since in self._down_since.items())

    def warnings(self) -> list[str]:
        notes, self._notes = self._notes, []
        return [*notes, *filter(None, [self._machine.poll_warning()])]

    def close(self) -> None:
        self._machine.stop()
        self._kill()  # none is left running, whatever happened

    def selfload(self, own: SelfLoadReport | None) -> SelfLoadReport | None:
        if own is None:
            return None
        workers = [w.selfload for w in self.reports]
        return selfcheck.merged(own, workers, self._machine.report())

    def endpoints(self, tally: Tally, elapsed_s: float) -> tuple[EndpointReport, ...]:
        return endpoint_reports(self._endpoints, self.reports, tally, elapsed_s)

    # -- the worker processes ------------------------------------------------------------------

    def live(self) -> list[WorkerProc]:
        return [p for p in self.procs if not p.dead]

    def _held(self) -> int:
        return sum(len(p.held) for p in self.live())

    def _start(self, setup: WorkerSetup, index: int | None = None) -> None:
        setup = replace(setup, answered=setup.answered or self.answered)  # a replacement too
        try:  # the key goes over the pipe, in the setup
            n = self._pool.start(setup, index)
        except OSError as exc:  # out of processes or descriptors: the run stops, resumable
            self._control.fail("workers", f"could not start a worker process: {exc}")
            return
        proc = WorkerProc(setup, self._pool.procs[n])
        if index is None:
            self.procs.append(proc)
        else:
            self.procs[index] = proc

    def _read(self, timeout_s: float | None) -> bool:
        """Take the workers' next group of messages, waiting up to ``timeout_s`` (None: not at
        all); False when none came."""
        event = self._pool.next(timeout_s)
        if event is None:
            return False
        index, messages = event
        if index < 0:  # the queue's wake: items to hand out
            return True
        proc = self.procs[index]
        for message in messages:
            if message is ENDED:
                self._ended(index, proc)
            elif message[0] == "done":
                proc.done = message[1]
            elif message[0] == "paused":
                proc.paused = bool(message[1])
            else:
                self._told(proc, message)
        return True

    def _told(self, proc: WorkerProc, message: tuple[object, ...]) -> None:
        kind, queue = message[0], self._queue
        if kind == "line":
            _, item_id, line, text, tokens, label, model = message
            if model is not None:
                self._control.served(model)  # type: ignore[arg-type]
            self._journal.record(line, text, tokens, label)  # type: ignore[arg-type]
            if not self.answered and isinstance(line, dict) and line.get("ok") is True:
                self._tell_answered()
            if (task := proc.release(item_id)) is not None:
                queue.finished(task)
        elif kind in ("finished", "back"):
            if (task := proc.release(message[1])) is not None:
                queue.finished(task) if kind == "finished" else queue.hand_again(task)
        elif kind == "fail":
            self._control.fail(message[1], message[2])  # type: ignore[arg-type]
        elif kind == "warn":
            self._notes.append(str(message[1]))
        elif kind == "event" and isinstance(event := message[1], OutageEvent):
            if event.event == "down":
                self._down_since.setdefault(event.endpoint, self._clock())
            elif event.event in ("up", "gave_up"):
                self._down_since.pop(event.endpoint, None)
            self._on_event(event)

    def _tell_answered(self) -> None:
        """A server answered: from now on each worker's refusals are an outage to wait out,
        never "nothing ever answered" (which ends the whole run as no server)."""
        self.answered = True
        for proc in self.live():
            proc.send(("answered",))

    def _kill(self) -> None:
        """Kill every worker now; what each had sent before it died is read, and what it held
        settled (``_read``) — none is replaced."""
        self._closing = True
        self._pool.kill()
        while self.live() and self._read(None):
            pass

    def _ended(self, index: int, proc: WorkerProc) -> None:
        """Its output ended and it was reaped: what it held is settled, and it is replaced."""
        left = proc.ended()
        if proc.done is not None:
            self.reports.append(proc.done)
        for task in left:  # sent again, or left to the rerun when stopping
            if self._control.stop.is_set():
                self._queue.finished(task)
            else:
                self._queue.hand_again(task)
        if proc.done is not None or self._control.stop.is_set() or self._closing:
            return
        pid, how = proc.proc.pid, proc.proc.how_it_ended()
        again = self._replacements < MAX_REPLACEMENTS
        self._replacements += again
        if again:
            self._notes.append(
                f"worker process {proc.setup.index} (PID {pid}) {how}; its "
                f"{len(left)} unanswered item(s) go back to the queue; a new worker starts"
            )
            self._start(proc.setup, index)
        elif not self.live():
            self._control.fail(
                "workers",
                f"every worker process ended unexpectedly (the last {how}) after "
                f"{MAX_REPLACEMENTS} replacements",
            )
        else:
            self._notes.append(
                f"worker process {proc.setup.index} (PID {pid}) {how}; no more "
                "replacements this run, the other workers carry on"
            )

"""A worker process of ``batch --workers N`` (``workers.py``): items in from the parent, finished
lines out.

Its job is a ``WorkerSetup``, sent first over the pipe (``load.procs.pool``). It sends its share
of the slots as one process does (``senders.Sending``: the engine on this process's I/O loop),
with a queue that the parent fills and a journal that only sends each line back; the parent
writes and counts it. Every item's answer is read on that one loop thread, so the item whose
line was just sent and the model that answered it are plain fields. It ends when the parent
says there are no more items, and at once when its input ends without that (the parent died:
nobody is left to write what it would answer; ``channel.listen``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any

from calibrate.gpu.selfload import SelfLoadReport
from calibrate.io.tasks import ItemId, Task
from calibrate.load.procs.channel import Channel, Outbox, listen
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.load.procs.selfcheck import DEFAULT_LIMITS, CheckLimits, worker_advice, worker_check
from calibrate.load.procs.selfcheck import parent_advice as parent_advice_
from calibrate.stages.batch.journal import Tally
from calibrate.stages.batch.plan import BatchSpec
from calibrate.stages.batch.sending.control import BatchControl, ReachabilityGuard
from calibrate.stages.batch.sending.lanes import EndpointReport, make_lane
from calibrate.stages.batch.sending.outage import OutagePolicy
from calibrate.stages.batch.sending.pacing import Work
from calibrate.stages.batch.sending.queue import MAX_REQUEUES, waiting_task
from calibrate.stages.batch.sending.senders import POLL_S, Sending
from calibrate.state.setting import Endpoint

INSTEAD = "lower -c"  # the self-check's advice when no more processes would help


def advice(workers: int) -> str:
    """What the self-check tells a run whose worker process (or only process) is the limit."""
    return worker_advice(workers, INSTEAD)


def parent_advice(workers: int) -> str:
    """… and when the parent (one feeder and journal for all workers) is the limit."""
    return parent_advice_(
        workers, "reads --input and writes --out for", f"{INSTEAD}, or run on a faster CPU"
    )


def split(endpoints: Sequence[Endpoint], workers: int) -> list[tuple[Endpoint, ...]]:
    """Each worker's share of the endpoints' slots, dealt one slot at a time in turn."""
    counts = [[0] * len(endpoints) for _ in range(workers)]
    turn = 0
    for e_index, endpoint in enumerate(endpoints):
        for _ in range(endpoint.concurrency):
            counts[turn % workers][e_index] += 1
            turn += 1
    return [
        tuple(
            Endpoint(e.base_url, n, e.concurrency_source)
            for e, n in zip(endpoints, row, strict=True)
            if n > 0
        )
        for row in counts
    ]


@dataclass(frozen=True)
class LaneStats:
    """What one worker's breaker saw of one endpoint (merged into the summary)."""

    label: str
    state: str
    incidents: int
    down_total_s: float
    restarts: int


@dataclass(frozen=True)
class WorkerDone:
    """A worker's last message: every item it took has been answered or left."""

    selfload: SelfLoadReport
    lanes: tuple[LaneStats, ...]


@dataclass(frozen=True)
class WorkerSetup:
    """The first message to a worker: its share of each endpoint's slots and the run's spec."""

    index: int
    endpoints: tuple[Endpoint, ...]  # its own share: concurrency already split
    client: ClientRecipe  # how it builds its clients
    spec: BatchSpec
    outage: OutagePolicy
    advice: str  # the self-check's advice when this worker is the bottleneck
    limits: CheckLimits = DEFAULT_LIMITS  # its self-check's thresholds
    answered: bool = False  # a server answered already (the endpoints' check, another worker)
    server_pids: tuple[int, ...] = ()  # the server's processes on this machine (the self-check)

    def serve(self, inbox: Channel, outbox: Outbox) -> None:
        """What the worker process runs (``load.procs.pool.Job``): its slots, then its report."""
        outbox.put("done", serve(self, inbox, outbox))


class ParentQueue:
    """The ``WorkQueue`` this process's items come from: those the parent sent; leaving ones
    told back."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._tasks: SimpleQueue[Task | None] = SimpleQueue()
        self._requeues: dict[ItemId, int] = {}
        self._lined: ItemId | None = None  # the item whose line was just sent
        self.ended = False

    def give(self, task: Task | None) -> None:
        if task is None:
            self.ended = True
        self._tasks.put(task)

    def idle(self) -> bool:
        """The parent said no more items will come: a paused endpoint's slots need not wait
        (those still queued here go to the slots that are up; the end mark stays queued)."""
        return self.ended

    def take_waiting(self) -> Task | None:
        """An item already here, without waiting; None if there is none (or only the end
        mark, which stays for the next ``take``)."""
        return waiting_task(self._tasks)

    def give_back_waiting(self) -> None:
        """Send the items not yet taken back to the parent (the end mark stays)."""
        while True:
            try:
                task = self._tasks.get_nowait()
            except Empty:
                return
            if task is None:
                self._tasks.put(None)
                return
            self._outbox.put("back", task.id)

    def lined(self, item_id: ItemId | None) -> None:
        self._lined = item_id

    def finished(self, task: Task) -> None:
        self._requeues.pop(task.id, None)
        if self._lined == task.id:
            self._lined = None  # its line said it: no second message
            return
        self._outbox.put("finished", task.id)

    def put_back_item(self, task: Task) -> bool:
        count = self._requeues.get(task.id, 0) + 1
        if count > MAX_REQUEUES:
            return False
        self._requeues[task.id] = count
        self._outbox.put("back", task.id)
        return True


class LineSender:
    """The ``Journal`` this process's items see: each line goes to the parent, which writes it."""

    def __init__(self, outbox: Outbox, queue: ParentQueue) -> None:
        self._outbox = outbox
        self._queue = queue
        self._model: str | None = None  # the model that answered the item being recorded

    def note_served(self, model: str | None) -> None:
        self._model = model

    backlogged = False  # the outbox thread sends in groups; nothing here waits for room

    def record(
        self,
        line: dict[str, Any],
        text: str | None,
        tokens: int | None,
        endpoint: str,
        *,
        wait: bool = True,
    ) -> None:
        model, self._model = self._model, None
        self._queue.lined(line.get("id"))
        self._outbox.put("line", line.get("id"), line, text, tokens, endpoint, model)


_STATES = {"up": 0, "down": 1, "gone": 2}


def endpoint_reports(
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


def serve(setup: WorkerSetup, inbox: Channel, outbox: Outbox) -> WorkerDone:
    """Run this worker's slots until the parent's items end or it says stop."""
    spec = setup.spec
    control = BatchControl()
    queue = ParentQueue(outbox)
    journal = LineSender(outbox, queue)
    control.served = journal.note_served
    lanes = [
        make_lane(
            e,
            setup.client.client(e.base_url, e.concurrency),
            setup.outage,
            on_event=lambda event: outbox.put("event", event),
        )
        for e in setup.endpoints
    ]
    slots = sum(lane.concurrency for lane in lanes)
    guard = ReachabilityGuard(
        slots,
        lambda detail: control.fail("unreachable", detail),
        lambda detail: control.fail("unknown_model", detail),
    )
    guard.answered = setup.answered  # then a refusal here is an outage, not "no server at all"
    listen(inbox, _told(queue, control, guard))
    monitor = worker_check(  # on the parent's rule: the server's processes it found
        "calibrate's own process",
        lambda: setup.server_pids,
        limits=setup.limits,
        advice=setup.advice,
    ).start()
    sending = Sending(lanes, Work(queue, spec, journal, control, guard))
    sending.start()
    told, paused = False, False
    while not sending.settle(POLL_S):
        if text := monitor.poll_warning():
            outbox.put("warn", text)
        if control.reason is not None and not told:
            told = True
            outbox.put("fail", control.reason, control.detail)
        if paused != (paused := all(lane.breaker.down for lane in lanes)):
            outbox.put("paused", paused)  # every endpoint of this worker is down, or back
        if paused:
            queue.give_back_waiting()  # the other workers' endpoints may be up
    if text := monitor.poll_warning():  # the last window, after the last item
        outbox.put("warn", text)
    if control.reason is not None and not told:
        outbox.put("fail", control.reason, control.detail)
    stats = tuple(
        LaneStats(
            lane.label,
            lane.breaker.state,
            lane.breaker.incidents,
            lane.breaker.unavailable_s(),
            lane.breaker.restarts,
        )
        for lane in lanes
    )
    return WorkerDone(monitor.stop(), stats)


def _told(
    queue: ParentQueue, control: BatchControl, guard: ReachabilityGuard
) -> Callable[[tuple[Any, ...]], None]:
    """What the parent's messages do: items, their end, stop, "a server answered"."""

    def handle(message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "tasks":
            for task in message[1]:
                queue.give(task)
        elif kind == "end":
            queue.give(None)
        elif kind == "answered":  # another worker's item was answered ok: no "nothing ever
            guard.answered = guard.served = True  # did", and the model is served
        elif kind == "stop":
            control.stop.set()  # no reason of its own: the parent knows why
            queue.give(None)

    return handle

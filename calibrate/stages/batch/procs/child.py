"""A worker process of ``batch --workers N``: items in from the parent, finished lines out.

Started by the parent as ``python -m calibrate.stages.batch.procs.child`` with two pipes. It
sends its share of the slots as one process does (``sending.Sending``: the engine on this
process's I/O loop), with a queue that the parent fills and a journal that only sends each line
back; the parent writes and counts it. Every item's answer is read on that one loop thread, so
the item whose line was just sent and the model that answered it are plain fields. It
ends when the parent says there are no more items, and at once when its input ends without
that (the parent died: nobody is left to write what it would answer). Ctrl-C (and a hang-up)
reaches the whole process group; a worker ignores it and stops when the parent tells it to.
"""

from __future__ import annotations

import os
import threading
from queue import Empty, SimpleQueue
from typing import Any

from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.io.tasks import ItemId, Task
from calibrate.load.procs.channel import Outbox, worker_pipes
from calibrate.stages.batch.control import BatchControl, ReachabilityGuard
from calibrate.stages.batch.lanes import make_lane
from calibrate.stages.batch.procs.wire import Channel, LaneStats, WorkerDone, WorkerSetup
from calibrate.stages.batch.queue import MAX_REQUEUES, waiting_task
from calibrate.stages.batch.sending import Sending

POLL_S = 0.2


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
        tokens: int,
        endpoint: str,
        *,
        wait: bool = True,
    ) -> None:
        model, self._model = self._model, None
        self._queue.lined(line.get("id"))
        self._outbox.put("line", line.get("id"), line, text, tokens, endpoint, model)


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
            setup.client.client(e),
            setup.outage,
            on_event=lambda event: outbox.put("event", event),
        )
        for e in setup.endpoints
    ]
    slots = sum(lane.concurrency for lane in lanes)
    guard = ReachabilityGuard(slots, lambda detail: control.fail("unreachable", detail))
    guard.answered = setup.answered  # then a refusal here is an outage, not "no server at all"
    threading.Thread(target=_listen, args=(inbox, queue, control, guard), daemon=True).start()
    monitor = SelfLoadMonitor(advice=setup.advice, cpu_limit=setup.cpu_limit).start()
    sending = Sending(lanes, queue, spec, journal, control, guard).start()
    told, paused = False, False
    while not sending.wait(POLL_S):
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
            lane.breaker.down_total_s,
            lane.breaker.restarts,
        )
        for lane in lanes
    )
    return WorkerDone(monitor.stop(), stats)


def _listen(
    inbox: Channel, queue: ParentQueue, control: BatchControl, guard: ReachabilityGuard
) -> None:
    """The parent's messages: items, their end, stop, "a server answered"; the end of the pipe
    ends this process."""
    while True:
        message = inbox.receive()
        if message is None:
            os._exit(0)  # the parent is gone (kill -9): no orphan, nothing left to send to
        kind = message[0]
        if kind == "tasks":
            for task in message[1]:
                queue.give(task)
        elif kind == "end":
            queue.give(None)
        elif kind == "answered":
            guard.answered = True  # another worker's server answered: no "nothing ever did"
        elif kind == "stop":
            control.stop.set()  # no reason of its own: the parent knows why
            queue.give(None)


def main() -> None:
    inbox, to_parent = worker_pipes("calibrate worker")
    setup = inbox.receive()
    if not isinstance(setup, WorkerSetup):
        return
    outbox = Outbox(to_parent, "batch-outbox")
    done = serve(setup, inbox, outbox)
    outbox.put("done", done)
    outbox.close()
    os._exit(0)  # daemon threads (the listener) need not be waited for


if __name__ == "__main__":
    main()

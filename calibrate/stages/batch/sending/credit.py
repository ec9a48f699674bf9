"""What the parent of ``batch --workers N`` holds for each worker process: the items sent to it
and not yet answered, at most its credit — its slots and as many again ahead, up to 64 — topped
up from the one ``WorkQueue`` by the run's one thread (``feed``), and settled when it ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from calibrate.io.tasks import ItemId, Task
from calibrate.load.procs.pool import Proc
from calibrate.stages.batch.sending.queue import WorkQueue
from calibrate.stages.batch.sending.worker import WorkerDone, WorkerSetup

AHEAD_MAX = 64  # items a worker holds beyond its slots, at most


@dataclass
class WorkerProc:
    """One worker process and the items sent to it and not yet answered."""

    setup: WorkerSetup
    proc: Proc
    held: dict[ItemId, Task] = field(default_factory=dict)
    dead: bool = False  # its end was read: what it held is settled
    told_stop: bool = False
    told_end: bool = False  # no more items for it
    paused: bool = False  # every endpoint of its share is down: the others take the items
    done: WorkerDone | None = None

    @property
    def credit(self) -> int:
        slots = sum(e.concurrency for e in self.setup.endpoints)
        return slots + min(slots, AHEAD_MAX) - len(self.held)

    def send(self, message: object) -> bool:
        return self.proc.send(message)

    def release(self, item_id: Any) -> Task | None:
        """The item is no longer this worker's (answered, put back); None if it was not."""
        return self.held.pop(item_id, None)

    def ended(self) -> list[Task]:
        """Its end was read: nothing more is held; what it held and did not answer."""
        self.dead, left, self.held = True, list(self.held.values()), {}
        return left


def feed(procs: Iterable[WorkerProc], queue: WorkQueue, stopping: bool) -> None:
    """Items waiting in the queue to each worker with credit left; the end to each once none
    is left, or the run is stopping. A paused worker gets none while any may still come: the
    others' endpoints may be up."""
    for proc in procs:
        if proc.told_end or (proc.paused and not queue.idle()):
            continue
        tasks: list[Task] = []
        while len(tasks) < proc.credit and not stopping:
            if (task := queue.take_waiting()) is None:
                break
            tasks.append(task)
        if tasks:  # a worker gone meanwhile: its end gives them back
            proc.held.update((t.id, t) for t in tasks)
            proc.send(("tasks", tasks))
        elif stopping or queue.idle():
            proc.told_end = True
            proc.send(("end",))

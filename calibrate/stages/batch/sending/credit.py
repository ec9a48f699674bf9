"""What the parent of ``batch --workers N`` holds for each worker process: the items sent to it
and not yet answered, fed from the one ``WorkQueue`` on credit by a thread of its own (at most
its slots and as many again ahead, up to 64), and handed back when the worker cannot answer them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from calibrate.io.tasks import ItemId, Task
from calibrate.load.procs.pool import Proc
from calibrate.stages.batch.sending.queue import WorkQueue
from calibrate.stages.batch.sending.senders import POLL_S
from calibrate.stages.batch.sending.worker import WorkerDone, WorkerSetup

MAX_SENT = 64  # items sent to a worker in one message, at most


@dataclass
class WorkerProc:
    """One worker process and what it holds: the items sent to it and not yet answered."""

    setup: WorkerSetup
    proc: Proc
    credit: threading.Semaphore = field(init=False)
    held: dict[ItemId, Task] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    dead: bool = False  # its end was read: what it held is settled
    told_stop: bool = False
    paused: bool = False
    done: WorkerDone | None = None

    def __post_init__(self) -> None:
        slots = sum(e.concurrency for e in self.setup.endpoints)
        self.credit = threading.Semaphore(slots + min(slots, 64))

    def send(self, message: object) -> bool:
        return self.proc.send(message)

    def release(self, item_id: ItemId) -> Task | None:
        """The item is no longer this worker's (answered, put back or left); None if it was not."""
        with self.lock:
            task = self.held.pop(item_id, None)
        if task is not None:
            self.credit.release()
        return task

    def ended(self) -> list[Task]:
        """Its end was read: nothing more is held; what it held and did not answer."""
        with self.lock:
            self.dead = True
            left = list(self.held.values())
            self.held.clear()
        return left


def give_back(queue: WorkQueue, stop: threading.Event, task: Task) -> None:
    """An item a worker did not answer: sent again, or left to the rerun when stopping."""
    if stop.is_set():
        queue.finished(task)
    else:
        queue.hand_again(task)


def feed(proc: WorkerProc, queue: WorkQueue, stop: threading.Event) -> None:
    """Items from the queue to this worker, while it has room for them (its feeder thread)."""
    while not proc.dead:
        if proc.paused:  # every endpoint of this worker is down: the others take the items
            if queue.idle():  # … and none is left: its slots need wait no longer
                proc.send(("end",))
                return
            time.sleep(POLL_S)
            continue
        if not proc.credit.acquire(timeout=POLL_S):
            continue
        task = queue.take(stop)
        if task is None:
            proc.credit.release()
            proc.send(("end",))
            return
        tasks = [task]
        while len(tasks) < MAX_SENT and proc.credit.acquire(blocking=False):
            if (more := queue.take_waiting()) is None:
                proc.credit.release()
                break
            tasks.append(more)  # those already waiting go in the same message
        with proc.lock:
            held = not proc.dead  # once dead, what it held was settled: not these
            if held:
                proc.held.update((t.id, t) for t in tasks)
        if not held:
            for t in tasks:
                give_back(queue, stop, t)
            return
        if not proc.send(("tasks", tasks)):
            for t in tasks:
                if proc.release(t.id) is not None:  # else its end settled it already
                    give_back(queue, stop, t)
            return

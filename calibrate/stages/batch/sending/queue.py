"""The items a batch sends: streamed from the input in order, plus those put back by an outage.

One feeder thread reads the input and hands items to the workers through a ``SimpleQueue``
(a C-level queue: taking an item is one ``get``, no Python lock or condition that every worker
waits on). It keeps ``workers + ahead`` items out at a time: finished items (told on a second
``SimpleQueue`` in lots of a quarter of ``ahead``, and one by one once the input is exhausted)
let it read as many more (a message per item woke the feeder's thread per item), so memory does
not grow with the file and a worker that finishes finds its next item already waiting. An item
whose endpoint went down is put back and handed out again, on any endpoint. The queue is
``idle`` when the input is exhausted, nothing was put back and nothing is in flight: then the
feeder sends the end mark, which every worker passes on before it ends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator
from queue import Empty, SimpleQueue
from typing import Final

from calibrate.errors import CalibrateError
from calibrate.io.tasks import ItemId, Task, read_tasks
from calibrate.stages.batch.plan import BatchPlan

log = logging.getLogger("calibrate")

MAX_REQUEUES = 10  # outages one item may ride out before its failure is recorded
MAX_AHEAD = 64  # items read ahead of the workers' (a finishing worker need not wait for one)
JOIN_S = 5.0

_CLOSE: Final = object()  # feeder message: stop handing out


def _nothing() -> None:
    pass


def waiting_task(tasks: SimpleQueue[Task | None]) -> Task | None:
    """A task already in ``tasks``, without waiting; None if there is none (or only the end
    mark ``None``, which stays for the next taker)."""
    try:
        task = tasks.get_nowait()
    except Empty:
        return None
    if task is None:
        tasks.put(None)
    return task


class WorkQueue:
    def __init__(self, plan: BatchPlan, workers: int = 1, ahead: int | None = None) -> None:
        self._plan = plan
        self._workers = max(workers, 1)
        self._ahead = min(self._workers, MAX_AHEAD) if ahead is None else max(ahead, 0)
        self._tasks: SimpleQueue[Task | None] = SimpleQueue()  # None: the end mark
        self._events: SimpleQueue[object] = SimpleQueue()  # finished (int), _CLOSE or a Task
        self._requeues: dict[ItemId, int] = {}  # an item's count is touched only by its holder
        self.closed = False
        self.drained = False  # input exhausted and every item handed out has left
        self._exhausted = False
        self.handed = 0
        self._cap = plan.to_run
        self.error = ""  # why the input could not be read again, when it could not
        self._feeder = threading.Thread(target=self._feed, name="batch-feeder", daemon=True)
        self._started = False
        # finished items are told to the feeder in lots, not one by one: each message to a
        # feeder waiting for one wakes its thread (a hand-off of the interpreter)
        self._lot = max(1, self._ahead // 4)
        self._untold = 0  # finished, not told yet (under _untold_lock)
        self._untold_lock = threading.Lock()
        # told after the feeder handed items out, put one back or ended: a reader that takes
        # them without waiting (``workers.WorkerSet``) looks again then, not at its next poll
        self.ready: Callable[[], None] = _nothing

    def start(self) -> WorkQueue:
        if not self._started:
            self._started = True
            self._feeder.start()
        return self

    def idle(self) -> bool:
        """No item left to send and none in flight (or the queue was closed)."""
        return self.closed or self.drained

    def take(self, stop: threading.Event) -> Task | None:
        """The next item; None when there are none left or the run is stopping.

        With the input exhausted but items still in flight, this waits: one may be put back.
        """
        if stop.is_set() or self.closed:
            return None
        task = self._tasks.get()
        if task is None or stop.is_set() or self.closed:
            self._tasks.put(None)  # pass the end mark on to the next worker
            return None  # an item taken after the stop stays for the rerun
        return task

    def take_waiting(self) -> Task | None:
        """An item already waiting, without waiting for one; None if there is none (or only
        the end mark, which stays for the next ``take``)."""
        return None if self.closed else waiting_task(self._tasks)

    def finished(self, task: Task) -> None:
        """The item has its line (or the run gave it up): it leaves the queue for good."""
        if self._requeues:
            self._requeues.pop(task.id, None)
        with self._untold_lock:
            self._untold += 1
            if self._untold < self._lot and not self._exhausted:
                return  # told with its lot (at once when the input is exhausted)
            count, self._untold = self._untold, 0
        self._events.put(count)

    def put_back_item(self, task: Task) -> bool:
        """Send the item again later; False when it has ridden out too many outages already."""
        count = self._requeues.get(task.id, 0) + 1
        if count > MAX_REQUEUES:
            return False
        self._requeues[task.id] = count
        self._events.put(task)
        return True

    def hand_again(self, task: Task) -> None:
        """Hand the item out again, not counted as an outage it rode out (a worker process
        died holding it, or put it back and counted that itself)."""
        self._events.put(task)

    def close(self) -> None:
        """Hand out nothing more; workers waiting for an item get the end mark."""
        if not self.closed:
            self.closed = True
            self._events.put(_CLOSE)
            self._tasks.put(None)

    def join(self, timeout_s: float = JOIN_S) -> None:
        if self._started:
            self._feeder.join(timeout_s)

    # -- the feeder thread ----------------------------------------------------------------

    def _feed(self) -> None:
        items = self._generate()
        out = 0  # handed out (waiting or in flight), not yet finished
        limit = self._workers + self._ahead
        try:
            while out < limit and self._hand(items):
                out += 1
            self.ready()
            out -= self._untold_once_exhausted()
            while out > 0:
                event = self._events.get()
                if event is _CLOSE:
                    return
                if isinstance(event, int):  # that many finished
                    out -= event
                    while out < limit and not self.closed and self._hand(items):
                        out += 1
                    out -= self._untold_once_exhausted()
                elif isinstance(event, Task):
                    self._tasks.put(event)  # put back: handed out again, still counted out
                self.ready()
        except Exception as exc:  # a bug here must end the run, never leave workers waiting
            log.exception("batch: the feeder failed")
            self.error = self.error or f"reading --input failed: {type(exc).__name__}: {exc}"
        finally:
            items.close()
            self.drained = True
            self._tasks.put(None)
            self.ready()

    def _untold_once_exhausted(self) -> int:
        """With the input exhausted, the finished items not told yet (every later one is told
        at once, so the feeder ends as the last one finishes); else 0."""
        if not self._exhausted:
            return 0
        with self._untold_lock:
            count, self._untold = self._untold, 0
        return count

    def _hand(self, items: Generator[Task, None, None]) -> bool:
        """Read the next item and hand it out; False once the input is exhausted."""
        if self.closed or self._exhausted:
            return False
        try:
            task = next(items, None)
        except (CalibrateError, OSError) as exc:  # the file changed or vanished meanwhile
            self.error = f"--input could not be read again (did it change during the run?): {exc}"
            task = None
        if task is None:
            if not self.error and self.handed < self._cap:
                self.error = (
                    f"--input gave only {self.handed} of {self._cap} items when "
                    "read again (did it change during the run?)"
                )
            self._exhausted = True
            return False
        self.handed += 1
        self._tasks.put(task)
        return True

    def _generate(self) -> Generator[Task, None, None]:
        plan = self._plan
        cap, sent = plan.to_run, 0
        skip = plan.done_ids if plan.spec.sample is None else set()
        shard = plan.spec.shard
        for task in read_tasks(plan.source_path, plan.spec.input_path):
            if sent >= cap:
                return
            if task.id in skip or (shard is not None and not shard.holds(task.id)):
                continue
            sent += 1
            yield task

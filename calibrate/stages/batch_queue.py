"""The items a batch sends: streamed from the input in order, plus those put back by an outage.

Workers take from the streamed file under one lock (no feeder thread, nothing read ahead of the
items in flight). An item whose endpoint went down is put back and taken first by the next free
worker, on any endpoint. The queue is ``idle`` when the input is exhausted, nothing was put back
and nothing is in flight: only then may a worker with nothing to do end.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Generator

from calibrate.errors import CalibrateError
from calibrate.stages.batch_input import ItemId, Task, read_tasks
from calibrate.stages.batch_plan import BatchPlan

MAX_REQUEUES = 10  # outages one item may ride out before its failure is recorded
WAIT_S = 0.2


class WorkQueue:
    def __init__(self, plan: BatchPlan) -> None:
        self._items = self._generate(plan)
        self._cond = threading.Condition()
        self._back: deque[Task] = deque()
        self._requeues: dict[ItemId, int] = {}
        self._closed = self._exhausted = False
        self.in_flight = 0
        self.handed = 0
        self._cap = plan.to_run
        self.error = ""  # why the input could not be read again, when it could not

    @staticmethod
    def _generate(plan: BatchPlan) -> Generator[Task, None, None]:
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

    def idle(self) -> bool:
        """No item left to send and none in flight (or the queue was closed)."""
        with self._cond:
            return self._closed or (self._exhausted and not self._back and not self.in_flight)

    def take(self, stop: threading.Event) -> Task | None:
        """The next item (put-back ones first); None when there are none left or stopping.

        With the input exhausted but items still in flight, wait: one may be put back.
        """
        with self._cond:
            while not self._closed and not stop.is_set():
                if self._back:
                    self.in_flight += 1
                    return self._back.popleft()
                if not self._exhausted:
                    task = self._next_from_input()
                    if task is not None:
                        self.in_flight += 1
                        return task
                    continue
                if not self.in_flight:
                    return None
                self._cond.wait(WAIT_S)
            return None

    def _next_from_input(self) -> Task | None:
        try:
            task = next(self._items, None)
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
            self._items.close()
            self._cond.notify_all()
        else:
            self.handed += 1
        return task

    def finished(self, task: Task) -> None:
        """The item has its line (or the run gave it up): it leaves the queue for good."""
        with self._cond:
            self.in_flight -= 1
            self._requeues.pop(task.id, None)
            self._cond.notify_all()

    def put_back_item(self, task: Task) -> bool:
        """Send the item again later; False when it has ridden out too many outages already."""
        with self._cond:
            count = self._requeues.get(task.id, 0) + 1
            if count > MAX_REQUEUES:
                return False
            self._requeues[task.id] = count
            self.in_flight -= 1
            self._back.append(task)
            self._cond.notify_all()
            return True

    def close(self) -> None:
        with self._cond:
            if not self._closed:
                self._closed = True
                self._items.close()
                self._cond.notify_all()

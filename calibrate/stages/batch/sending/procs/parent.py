"""The parent of ``batch --workers N``: one feeder, one journal, N worker processes.

Each worker process gets its share of every endpoint's slots and, through a sender thread,
items from the one ``WorkQueue`` (at most twice its slots ahead). The run's one thread reads
every worker's messages (``load.procs.proc.Workers``): a finished line is journaled, then its
item leaves the queue; an item put back (an outage) is handed out again. Items a worker holds
are remembered until its answer arrives, so when a worker dies (kill -9, a crash) its
unanswered items go back to the queue and a replacement starts (up to ``MAX_REPLACEMENTS`` in
a run; with none left the others go on, and when none is left the run stops, exit 1,
resumable). Stopping (Ctrl-C, a failed write, an unreachable server) tells every worker to
stop; past the grace period they are killed, and none is replaced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from queue import Empty, SimpleQueue

from calibrate.io.tasks import ItemId, Task
from calibrate.load.procs.proc import ENDED, Proc, Workers
from calibrate.stages.batch.sending.control import BatchControl
from calibrate.stages.batch.sending.procs.child import WorkerDone, WorkerSetup
from calibrate.stages.batch.sending.queue import WorkQueue
from calibrate.stages.batch.sending.senders import POLL_S
from calibrate.state.setting import Endpoint

MAX_SENT = 64  # items sent to a worker in one message, at most
MAX_REPLACEMENTS = 8  # workers started again in one run, at most (a crash loop ends)


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


@dataclass
class WorkerProc:
    """One worker process and what it holds: the items sent to it and not yet answered."""

    setup: WorkerSetup
    credit: threading.Semaphore
    proc: Proc
    held: dict[ItemId, Task] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    dead: bool = False  # its end was read: what it held is settled
    told_stop: bool = False
    paused: bool = False
    done: WorkerDone | None = None

    def send(self, message: object) -> bool:
        return self.proc.send(message)

    def release(self, item_id: ItemId) -> Task | None:
        """The item is no longer this worker's (answered, put back or left); None if it was not."""
        with self.lock:
            task = self.held.pop(item_id, None)
        if task is not None:
            self.credit.release()
        return task


Handler = Callable[[WorkerProc, tuple[object, ...]], None]


class WorkerSet:
    """The worker processes of one run (``Workers``), started, fed, read and replaced. Their
    messages are read by the run's one thread (``read``), which also starts the replacements;
    one feeder thread per worker sends it items."""

    def __init__(
        self,
        setups: Sequence[WorkerSetup],
        queue: WorkQueue,
        control: BatchControl,
        on_message: Handler,
        note: Callable[[str], None],
    ) -> None:
        self._queue = queue
        self._control = control
        self._on_message = on_message
        self._note = note
        self._replacements = 0
        self._closing = False
        self._workers = Workers("batch-worker")
        self.procs: list[WorkerProc] = []  # by the workers' index: the live one, or its last
        self.reports: list[WorkerDone] = []
        self._setups = list(setups)
        self.answered = any(s.answered for s in self._setups)

    def start(self) -> None:
        for setup in self._setups:
            self._start(setup)

    def _start(self, setup: WorkerSetup, index: int | None = None) -> None:
        setup = replace(setup, answered=setup.answered or self.answered)  # a replacement too
        try:  # the key goes over the pipe, in the setup
            n = self._workers.start(setup, index)
        except OSError as exc:  # out of processes or descriptors: the run stops, resumable
            self._control.fail("workers", f"could not start a worker process: {exc}")
            return
        slots = sum(e.concurrency for e in setup.endpoints)
        proc = WorkerProc(
            setup, threading.Semaphore(slots + min(slots, 64)), self._workers.procs[n]
        )
        if index is None:
            self.procs.append(proc)
        else:
            self.procs[index] = proc
        threading.Thread(target=self._feed, args=(proc,), daemon=True).start()

    def pids(self) -> list[int]:
        """The live workers' process ids (the machine-wide self-check reads their CPU)."""
        return self._workers.pids()

    def live(self) -> list[WorkerProc]:
        return [p for p in self.procs if not p.dead]

    def held(self) -> int:
        return sum(len(p.held) for p in self.live())

    def read(self, timeout_s: float | None) -> bool:
        """Take the workers' next group of messages, waiting up to ``timeout_s`` (None: not at
        all); False when none came."""
        event = self._workers.next(timeout_s)
        if event is None:
            return False
        index, messages = event
        proc = self.procs[index]
        for message in messages:
            if message is ENDED:
                self._ended(index, proc)
            elif message[0] == "done":
                proc.done = message[1]
            elif message[0] == "paused":
                proc.paused = bool(message[1])
            else:
                self._on_message(proc, message)
        return True

    def tell_answered(self) -> None:
        """A server answered: from now on each worker's refusals are an outage to wait out,
        never "nothing ever answered" (which ends the whole run as no server)."""
        if self.answered:
            return
        self.answered = True
        for proc in self.live():
            proc.send(("answered",))

    def stop_all(self) -> None:
        for proc in self.live():
            if not proc.told_stop:
                proc.told_stop = True
                proc.send(("stop",))

    def kill_all(self) -> None:
        """Kill every worker now; what each had sent before it died is read, and what it held
        settled (``read``) — none is replaced."""
        self._closing = True
        self._workers.kill()
        while self.live() and self.read(None):
            pass

    def _feed(self, proc: WorkerProc) -> None:
        """Items from the queue to this worker, while it has room for them."""
        while not proc.dead:
            if proc.paused:  # every endpoint of this worker is down: the others take the items
                if self._queue.idle():  # … and none is left: its slots need wait no longer
                    proc.send(("end",))
                    return
                time.sleep(POLL_S)
                continue
            if not proc.credit.acquire(timeout=POLL_S):
                continue
            task = self._queue.take(self._control.stop)
            if task is None:
                proc.credit.release()
                proc.send(("end",))
                return
            tasks = [task]
            while len(tasks) < MAX_SENT and proc.credit.acquire(blocking=False):
                if (more := self._queue.take_waiting()) is None:
                    proc.credit.release()
                    break
                tasks.append(more)  # those already waiting go in the same message
            with proc.lock:
                held = not proc.dead  # once dead, what it held was settled: not these
                if held:
                    proc.held.update((t.id, t) for t in tasks)
            if not held:
                for t in tasks:
                    self._give_back(t)
                return
            if not proc.send(("tasks", tasks)):
                for t in tasks:
                    if proc.release(t.id) is not None:  # else its end settled it already
                        self._give_back(t)
                return

    def _ended(self, index: int, proc: WorkerProc) -> None:
        """Its output ended and it was reaped: what it held is settled, and it is replaced."""
        with proc.lock:
            proc.dead = True
            left = list(proc.held.values())
            proc.held.clear()
        if proc.done is not None:
            self.reports.append(proc.done)
        for task in left:
            self._give_back(task)
        if proc.done is not None or self._control.stop.is_set() or self._closing:
            return
        pid, how = proc.proc.pid, proc.proc.how_it_ended()
        again = self._replacements < MAX_REPLACEMENTS
        self._replacements += again
        if again:
            self._note(
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
            self._note(
                f"worker process {proc.setup.index} (PID {pid}) {how}; no more "
                "replacements this run, the other workers carry on"
            )

    def _give_back(self, task: Task) -> None:
        """An item a worker did not answer: sent again, or left to the rerun when stopping."""
        if self._control.stop.is_set():
            self._queue.finished(task)
        else:
            self._queue.hand_again(task)


class Notes:
    """Warnings from the reader threads, shown by the main thread (between progress lines)."""

    def __init__(self) -> None:
        self._queue: SimpleQueue[str] = SimpleQueue()

    def put(self, text: str) -> None:
        self._queue.put(text)

    def drain(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except Empty:
                return out

"""The load worker processes of one sender: started once, used run after run, ended together.

Each worker is ``python -m calibrate.load.procs.child`` with two pipes; the first message
(``WorkerSetup``) is the client's recipe (the key travels over the pipe, never in argv, the
environment or a file), the parent's clock anchor and the server's processes on this machine
(told again before a run when they changed: a server restarted), which each worker's self-check
reads as the parent's does. A reader thread per worker puts every group of its messages on
one queue, and its end too, so the parent's one thread that runs a load reads them in order
and a worker that dies (kill -9, a crash, out of memory) is a ``WorkerDied`` the moment its
pipe closes — never a hang: every wait here has a bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any

from calibrate.errors import WorkerDied
from calibrate.http.request_times import anchor
from calibrate.load.procs.channel import Channel, spawn_worker
from calibrate.load.procs.recipe import ClientRecipe, WorkerSetup, server_pids_of

log = logging.getLogger("calibrate")
CHILD = "calibrate.load.procs.child"
READY_S = 60.0  # a worker that has not started within this is stuck (a loaded machine: ~1 s)
EXIT_WAIT_S = 5.0
AGAIN = (
    "Nothing of this run is measured. Run it again; if a worker dies again, look for its "
    "error above and for the kernel's out-of-memory killer (dmesg), or run with --workers 1"
)


def cores() -> int:
    """The cores this process may run on (``--workers auto`` takes at most these)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class Worker:
    """One worker process and its two pipes."""

    index: int
    popen: subprocess.Popen[bytes]
    to_child: Channel
    from_child: Channel
    reader: threading.Thread | None = None


Event = tuple[int, list[tuple[Any, ...]]]  # (worker, its messages) — ("ended",): its pipe closed


class WorkerPool:
    """``count`` worker processes and the one queue their messages arrive on."""

    def __init__(
        self,
        recipe: ClientRecipe,
        count: int,
        server_pids: Callable[[], Iterable[int]] = tuple,
    ) -> None:
        self._recipe = recipe
        self.count = count
        self.workers: list[Worker] = []
        self._events: SimpleQueue[Event] = SimpleQueue()
        self._server_pids = server_pids  # the server's processes on this machine, found afresh
        self._told: tuple[int, ...] = ()  # … as the workers were last told them

    def start(self) -> None:
        """Start the workers (once) and wait until each has built its client."""
        if self.workers:
            return
        self._events = SimpleQueue()
        self._told = server_pids_of(self._server_pids())
        try:
            for index in range(self.count):
                self.workers.append(self._spawn(index))
        except OSError as exc:  # out of processes or descriptors
            self.close()
            raise WorkerDied(
                f"could not start load worker process {len(self.workers) + 1} of "
                f"{self.count}: {exc}",
                "Lower --workers, or run with --workers 1",
            ) from exc
        ready: set[int] = set()
        deadline = time.monotonic() + READY_S
        while len(ready) < self.count:
            index, messages = self.next_event(deadline, "its start")
            if any(m[0] == "ready" for m in messages):
                ready.add(index)

    def _spawn(self, index: int) -> Worker:
        popen, to_child, from_child = spawn_worker(CHILD)
        worker = Worker(index, popen, to_child, from_child)
        who = f"load worker process {index + 1} of {self.count}"
        worker.to_child.send(WorkerSetup(self._recipe, who, *anchor(), self._told))
        worker.reader = threading.Thread(
            target=self._read, args=(worker,), name=f"load-worker-{index}", daemon=True
        )
        worker.reader.start()
        return worker

    def _read(self, worker: Worker) -> None:
        events = self._events  # this start's queue, not a later one's
        while (messages := worker.from_child.receive()) is not None:
            events.put((worker.index, messages))
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.popen.wait(EXIT_WAIT_S)
        events.put((worker.index, [("ended",)]))

    def tell_server(self) -> None:
        """Before a run: the server's processes, to every worker, when they changed since the
        workers were last told (a restarted server has new ones)."""
        now = server_pids_of(self._server_pids())
        if now != self._told:
            self._told = now
            for index in range(len(self.workers)):
                self.send(index, ("server", 0, now))

    def send(self, index: int, message: tuple[Any, ...]) -> None:
        """To one worker; a worker gone is reported by its reader (``ended``), not here."""
        self.workers[index].to_child.send(message)

    def next_event(self, deadline: float, during: str) -> Event:
        """The next group of messages from a worker; ``WorkerDied`` (every worker ended) when
        one has ended, reported an error, or none answered by ``deadline`` (monotonic s)."""
        try:
            index, messages = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
        except Empty:
            self.close()
            raise WorkerDied(
                f"the load worker processes sent nothing for too long during {during}", AGAIN
            ) from None
        for message in messages:
            if message[0] == "ended":
                raise self._died(index, during)
            if message[0] == "error":
                log.error("load worker process %d: %s", index + 1, message[3])  # its traceback
                self.close()
                raise WorkerDied(
                    f"load worker process {index + 1} of {self.count} failed during {during}: "
                    f"{message[2]}",
                    "This is calibrate's own bug (its traceback is above): run with --workers 1 "
                    "and report it",
                )
        return index, messages

    def _died(self, index: int, during: str) -> WorkerDied:
        worker = self.workers[index]
        code = worker.popen.poll()
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else f"exited with status {code}"
            if code is not None
            else "closed its pipe"
        )
        self.close()
        return WorkerDied(
            f"load worker process {index + 1} of {self.count} (PID {worker.popen.pid}) {how} "
            f"during {during}",
            AGAIN,
        )

    def close(self) -> None:
        """End every worker: the end of its input ends it; past a short wait it is killed."""
        workers, self.workers = self.workers, []
        for worker in workers:
            worker.to_child.close()
        for worker in workers:
            try:
                worker.popen.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                worker.popen.kill()
                worker.popen.wait()
            if worker.reader is not None:
                worker.reader.join(EXIT_WAIT_S)
            worker.from_child.close()

    def pids(self) -> list[int]:
        return [w.popen.pid for w in self.workers if w.popen.returncode is None]

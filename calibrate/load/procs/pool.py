"""The load worker processes of one sender: started once, used run after run, ended together.

Each worker is one of calibrate's worker processes (``proc.py``) running a ``LoadJob``: the
client's recipe (the key travels over the pipe, never in argv, the environment or a file), the
parent's clock anchor and the server's processes on this machine (told again before a run when
they changed: a server restarted), which each worker's self-check reads as the parent's does.
Each worker's reader thread puts every group of its messages on
one queue, and its end too, so the parent's one thread that runs a load reads them in order
and a worker that dies (kill -9, a crash, out of memory) is a ``WorkerDied`` the moment its
pipe closes — never a hang: every wait here has a bound.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from queue import Empty, SimpleQueue
from typing import Any

from calibrate.errors import WorkerDied
from calibrate.http.request_times import anchor
from calibrate.load.procs.child import LoadJob
from calibrate.load.procs.proc import Proc
from calibrate.load.procs.recipe import ClientRecipe, server_pids_of

log = logging.getLogger("calibrate")
READY_S = 60.0  # a worker that has not started within this is stuck (a loaded machine: ~1 s)
AGAIN = (
    "Nothing of this run is measured. Run it again; if a worker dies again, look for its "
    "error above and for the kernel's out-of-memory killer (dmesg), or run with --workers 1"
)


def _tell(
    events: SimpleQueue[Event], index: int
) -> tuple[Callable[[Proc, list[tuple[Any, ...]]], None], Callable[[Proc], None]]:
    """Worker ``index``'s reader callbacks: its messages, then its end, onto ``events``."""

    def told(proc: Proc, messages: list[tuple[Any, ...]]) -> None:
        events.put((index, messages))

    def ended(proc: Proc) -> None:
        events.put((index, [("ended",)]))

    return told, ended


def cores() -> int:
    """The cores this process may run on (``--workers auto`` takes at most these)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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
        self.workers: list[Proc] = []
        self._events: SimpleQueue[Event] = SimpleQueue()
        self._server_pids = server_pids  # the server's processes on this machine, found afresh
        self._told: tuple[int, ...] = ()  # … as the workers were last told them

    def start(self) -> None:
        """Start the workers (once) and wait until each has built its client."""
        if self.workers:
            return
        events: SimpleQueue[Event] = SimpleQueue()  # this start's queue, not a later one's
        self._events = events
        self._told = server_pids_of(self._server_pids())
        try:
            for index in range(self.count):
                who = f"load worker process {index + 1} of {self.count}"
                job = LoadJob(self._recipe, who, *anchor(), self._told)
                told, ended = _tell(events, index)
                self.workers.append(Proc.start(job, told, ended, f"load-worker-{index}"))
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
        self.workers[index].send(message)

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
        how = worker.how_it_ended()
        self.close()
        return WorkerDied(
            f"load worker process {index + 1} of {self.count} (PID {worker.pid}) {how} "
            f"during {during}",
            AGAIN,
        )

    def close(self) -> None:
        """End every worker: the end of its input ends it; past a short wait it is killed."""
        workers, self.workers = self.workers, []
        for worker in workers:
            worker.close()

    def pids(self) -> list[int]:
        return [w.pid for w in self.workers if w.popen.returncode is None]

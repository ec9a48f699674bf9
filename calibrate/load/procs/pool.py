"""The load worker processes of one sender: started once, used run after run, ended together.

Each worker is one of calibrate's worker processes (``proc.Workers``) running a ``LoadJob``: the
client's recipe (the key travels over the pipe, never in argv, the environment or a file), the
parent's clock anchor and the server's processes on this machine (told again before a run when
they changed: a server restarted), which each worker's self-check reads as the parent's does.
Every group of a worker's messages, and its end too, arrives on
one queue, so the parent's one thread that runs a load reads them in order and a worker that
dies (kill -9, a crash, out of memory) is a ``WorkerDied`` the moment its
pipe closes — never a hang: every wait here has a bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from calibrate.errors import WorkerDied
from calibrate.http.request_times import anchor
from calibrate.load.procs.child import LoadJob
from calibrate.load.procs.proc import ENDED, Event, Workers
from calibrate.load.procs.recipe import ClientRecipe, server_pids_of
from calibrate.load.procs.selfcheck import DEFAULT_LIMITS, CheckLimits

log = logging.getLogger("calibrate")
READY_S = 60.0  # a worker that has not started within this is stuck (a loaded machine: ~1 s)
AGAIN = (
    "Nothing of this run is measured. Run it again; if a worker dies again, look for its "
    "error above and for the kernel's out-of-memory killer (dmesg), or run with --workers 1"
)


class WorkerPool:
    """``count`` worker processes and the one queue their messages arrive on."""

    def __init__(
        self,
        recipe: ClientRecipe,
        count: int,
        server_pids: Callable[[], Iterable[int]] = tuple,
        limits: CheckLimits = DEFAULT_LIMITS,
    ) -> None:
        self._recipe = recipe
        self.count = count
        self._limits = limits  # each worker's self-check
        self._workers = Workers("load-worker")
        self._server_pids = server_pids  # the server's processes on this machine, found afresh
        self._told: tuple[int, ...] = ()  # … as the workers were last told them

    def start(self) -> None:
        """Start the workers (once) and wait until each has built its client."""
        workers = self._workers
        if workers.procs:
            return
        self._told = server_pids_of(self._server_pids())
        try:
            for index in range(self.count):
                who = f"load worker process {index + 1} of {self.count}"
                workers.start(LoadJob(self._recipe, who, *anchor(), self._told, self._limits))
        except OSError as exc:  # out of processes or descriptors
            started = len(workers.procs)
            self.close()
            raise WorkerDied(
                f"could not start load worker process {started + 1} of {self.count}: {exc}",
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
            for index in range(len(self._workers.procs)):
                self.send(index, ("server", 0, now))

    def send(self, index: int, message: tuple[Any, ...]) -> None:
        """To one worker; a worker gone is reported by its reader (``ENDED``), not here."""
        self._workers.send(index, message)

    def next_event(self, deadline: float, during: str) -> Event:
        """The next group of messages from a worker; ``WorkerDied`` (every worker ended) when
        one has ended, reported an error, or none answered by ``deadline`` (monotonic s)."""
        event = self._workers.next(deadline - time.monotonic())
        if event is None:
            self.close()
            raise WorkerDied(
                f"the load worker processes sent nothing for too long during {during}", AGAIN
            )
        index, messages = event
        for message in messages:
            if message is ENDED:
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
        worker = self._workers.procs[index]
        how = worker.how_it_ended()
        self.close()
        return WorkerDied(
            f"load worker process {index + 1} of {self.count} (PID {worker.pid}) {how} "
            f"during {during}",
            AGAIN,
        )

    def close(self) -> None:
        """End every worker: the end of its input ends it; past a short wait it is killed."""
        self._workers.close()

    def pids(self) -> list[int]:
        return self._workers.pids()

"""calibrate's worker processes, for every stage that sends from several (``--workers``): the one
pool. The ladder's and sweep's loops (``sender.py``) and batch's items
(``stages.batch.sending.workers``) each run a job of their own in it; what a worker's end means
is the job's side (a load run is lost; a batch's held items go back and a new worker starts).

``start(job)`` runs ``python -m calibrate.load.procs.child`` with two pipes and sends ``job``
first: an object whose ``serve(inbox, outbox)`` the child runs (``child.LoadJob``;
``stages.batch.sending.worker.WorkerSetup``). Whatever the job needs (the API key too) travels
in it, over the pipe, never in argv, the environment or a file. One reader thread per process
puts each group of its messages on the pool's one queue and, once its output ends (it finished,
died or was killed), waits for it to be reaped and puts its ``ENDED``: the one thread that runs
the load reads them in order, a worker that dies is noticed the moment its pipe closes, never by
polling, and every wait here has a bound.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from queue import Empty, SimpleQueue
from typing import Any, Protocol

from calibrate.load.procs.channel import Channel, Outbox, spawn_worker
from calibrate.load.procs.recipe import server_pids_of

CHILD = "calibrate.load.procs.child"
EXIT_WAIT_S = 5.0
ENDED = ("ended",)  # a worker's last event: its pipe closed and it was reaped
Event = tuple[int, Sequence[tuple[Any, ...]]]  # (the worker's index, a group of its messages)


class Job(Protocol):
    """A worker's first message: what it runs until the parent closes its input."""

    def serve(self, inbox: Channel, outbox: Outbox) -> None: ...


class Proc:
    """One worker process, its two pipes and its reader thread (which tells ``events``)."""

    def __init__(self, job: Job, events: SimpleQueue[Event], index: int, name: str) -> None:
        self.popen, self._to_child, self._from_child = spawn_worker(CHILD)  # OSError: none
        self.send(job)
        self._reader = threading.Thread(
            target=self._read, args=(events, index), name=name, daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def send(self, message: Any) -> bool:
        """To the worker; False when it is gone (its ``ENDED`` says so too)."""
        return self._to_child.send(message)

    def _read(self, events: SimpleQueue[Event], index: int) -> None:
        while (messages := self._from_child.receive()) is not None:
            events.put((index, messages))
        self._reap()
        self._from_child.close()
        self._to_child.close()
        events.put((index, (ENDED,)))

    def how_it_ended(self) -> str:
        """How the process ended, in words (for a line naming it)."""
        code = self.popen.poll()
        if code is not None and code < 0:
            return f"was killed by signal {-code}"
        return f"exited with status {code}" if code is not None else "closed its pipe"

    def close(self) -> None:
        """End it: the end of its input ends it; past a short wait it is killed."""
        self._to_child.close()
        self._ended()

    def kill(self) -> None:
        """Kill it now and wait until it is reaped."""
        if self.popen.poll() is None:
            self.popen.kill()
        self._ended()

    def _reap(self) -> None:
        try:
            self.popen.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:  # its output closed, the process lingers: end it
            self.popen.kill()
            self.popen.wait()

    def _ended(self) -> None:
        self._reap()
        if self._reader is not threading.current_thread():
            self._reader.join(EXIT_WAIT_S)
        with contextlib.suppress(OSError):
            self._from_child.close()


class WorkerPool:
    """The worker processes of one sender or run, each running its job, and the one queue their
    messages and their ends arrive on (``next``). Read by one thread, which also starts them: an
    event is never read before its worker is listed here. ``server_pids`` finds the server's
    processes on this machine afresh; the workers are told them in their jobs (``server``) and
    again before a run when they changed (``tell_server``: a restarted server has new ones)."""

    def __init__(self, name: str, server_pids: Callable[[], Iterable[int]] = tuple) -> None:
        self.name = name  # its reader threads are ``name-1``, ``name-2``, …
        self.procs: list[Proc] = []
        self._events: SimpleQueue[Event] = SimpleQueue()
        self._server_pids = server_pids
        self._told: tuple[int, ...] = ()  # the server's processes as the workers were last told

    def server(self) -> tuple[int, ...]:
        """The server's processes found now, to tell the workers about to start."""
        self._told = server_pids_of(self._server_pids())
        return self._told

    def tell_server(self) -> None:
        """Before a run: the server's processes, to every worker, when they changed since the
        workers were last told."""
        now = server_pids_of(self._server_pids())
        if now != self._told:
            self._told = now
            for index in range(len(self.procs)):
                self.send(index, ("server", 0, now))

    def start(self, job: Job, index: int | None = None) -> int:
        """Start a worker running ``job``: a new one, or worker ``index`` again (its last one
        has ended); its index. Raises OSError when no process can start."""
        n = len(self.procs) if index is None else index
        proc = Proc(job, self._events, n, f"{self.name}-{n + 1}")
        if index is None:
            self.procs.append(proc)
        else:
            self.procs[index] = proc
        return n

    def next(self, timeout_s: float | None) -> Event | None:
        """The next group of a worker's messages (``ENDED``: it is gone); None when nothing
        came within ``timeout_s`` (None: no waiting)."""
        try:
            if timeout_s is None:
                return self._events.get_nowait()
            return self._events.get(timeout=max(0.0, timeout_s))
        except Empty:
            return None

    def wake(self) -> None:
        """Have ``next`` return now, from any thread (an event of no worker: index -1)."""
        self._events.put((-1, ()))

    def send(self, index: int, message: Any) -> bool:
        """To one worker; False when it is gone (its ``ENDED`` says so too)."""
        return self.procs[index].send(message)

    def pids(self) -> list[int]:
        """The live workers' process ids (a self-check reads their CPU)."""
        return [p.pid for p in self.procs if p.popen.returncode is None]

    def kill(self) -> None:
        """Kill every worker now and wait until each is reaped (their events stay queued)."""
        for proc in list(self.procs):
            proc.kill()

    def close(self) -> None:
        """End every worker: the end of its input ends it; past a short wait it is killed.
        What they still had to say is dropped; a later ``start`` begins a new set."""
        procs, self.procs, self._events = self.procs, [], SimpleQueue()
        for proc in procs:
            proc.close()

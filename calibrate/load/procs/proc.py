"""One worker process of calibrate's, for every stage that sends from several (``--workers``).

``Proc.start(job, ...)`` runs ``python -m calibrate.load.procs.child`` with two pipes and sends
``job`` first: an object whose ``serve(inbox, outbox)`` the child runs (the sweep's and the
ladder's loops, ``child.LoadJob``; batch's share of the items, ``stages.batch.procs.child``).
Whatever the job needs (the API key too) travels in it, over the pipe, never in argv, the
environment or a file. One reader thread per process hands each group of its messages to
``on_messages`` and, once its output ends (it finished, died or was killed), waits for it to be
reaped and calls ``on_end``: a worker that dies is noticed the moment its pipe closes, never by
polling, and every wait here has a bound.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
from collections.abc import Callable
from typing import Any, Protocol

from calibrate.load.procs.channel import Channel, Outbox, spawn_worker

CHILD = "calibrate.load.procs.child"
EXIT_WAIT_S = 5.0


class Job(Protocol):
    """A worker's first message: what it runs until the parent closes its input."""

    def serve(self, inbox: Channel, outbox: Outbox) -> None: ...


class Proc:
    """One worker process, its two pipes and its reader thread."""

    def __init__(self, popen: subprocess.Popen[bytes], to_child: Channel, from_child: Channel):
        self.popen = popen
        self._to_child = to_child
        self._from_child = from_child
        self.reader: threading.Thread | None = None

    @classmethod
    def start(
        cls,
        job: Job,
        on_messages: Callable[[Proc, list[tuple[Any, ...]]], None],
        on_end: Callable[[Proc], None],
        name: str,
    ) -> Proc:
        """The worker started and sent ``job``; raises OSError when no process can start."""
        proc = cls(*spawn_worker(CHILD))
        proc.send(job)
        proc.reader = threading.Thread(
            target=proc._read, args=(on_messages, on_end), name=name, daemon=True
        )
        proc.reader.start()
        return proc

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        """Its reader has not yet seen the end of its output."""
        return self.reader is not None and self.reader.is_alive()

    def send(self, message: Any) -> bool:
        """To the worker; False when it is gone (its reader says so too, with ``on_end``)."""
        return self._to_child.send(message)

    def _read(
        self,
        on_messages: Callable[[Proc, list[tuple[Any, ...]]], None],
        on_end: Callable[[Proc], None],
    ) -> None:
        while (messages := self._from_child.receive()) is not None:
            on_messages(self, messages)
        try:
            self.popen.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:  # its output closed, the process lingers: end it
            self.popen.kill()
            self.popen.wait()
        self._from_child.close()
        self._to_child.close()
        on_end(self)

    def how_it_ended(self) -> str:
        """How the process ended, in words (for a line naming it)."""
        code = self.popen.poll()
        if code is not None and code < 0:
            return f"was killed by signal {-code}"
        return f"exited with status {code}" if code is not None else "closed its pipe"

    def close(self) -> None:
        """End it: the end of its input ends it; past a short wait it is killed."""
        self._to_child.close()
        self.wait_ended()

    def kill(self) -> None:
        """Kill it now and wait until it is reaped."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.wait_ended()

    def wait_ended(self) -> None:
        try:
            self.popen.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        if self.reader is not None and self.reader is not threading.current_thread():
            self.reader.join(EXIT_WAIT_S)
        with contextlib.suppress(OSError):
            self._from_child.close()

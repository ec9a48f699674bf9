"""calibrate's one worker process (``pool.py``), and the load job it runs for the sweep and the
ladder: its share of a closed or open loop, sent by the ordinary engine.

Started as ``python -m calibrate.load.procs.child`` with two pipes, it runs the job its first
message is (``job.serve(inbox, outbox)``): a ``LoadJob`` here, batch's share of the items
(``stages.batch.sending.worker.WorkerSetup``) there. A ``LoadJob`` holds the client's recipe
(the key in memory only), the parent's clock anchor and the server's processes on this machine
(``selfcheck.worker_check``: this worker judges its late threads on the parent's rule); then
it runs one run at a time: a closed loop at its share of C, fed requests by the parent ahead
of need (it says how many it took, the parent sends as many more), an open loop over its
share of the schedule, or its part of a ladder's wave (held until every worker holds its part,
then released at one moment). It starts each run at the parent's ``go_at`` and hands back the
``LoopRun``, ``OpenRun`` or wave as the one-process engine makes it, with why this process was
the client's limit during it ("" when it kept up) last; the parent merges.
The end of its input (the parent died or closed it) ends it at once. Ctrl-C reaches the whole
process group: a worker ignores it, the parent ends it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

from calibrate.errors import format_traceback
from calibrate.http.request_times import use_anchor
from calibrate.load.engine import Record
from calibrate.load.procs.channel import Channel, Outbox, listen, worker_pipes
from calibrate.load.procs.pool import Job
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.load.procs.selfcheck import DEFAULT_LIMITS, CheckLimits, worker_check
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.load.transport import HttpTransport
from calibrate.load.window import LevelWindow


@dataclasses.dataclass(frozen=True)
class StoppableWindow(LevelWindow):
    """A share's window that also ends when the parent says another worker's answer failed
    (one process stops the whole loop then: more load only adds noise)."""

    stop: threading.Event = dataclasses.field(default_factory=threading.Event, compare=False)

    def done(self, elapsed_s: float, started: int) -> bool:
        return self.stop.is_set() or super().done(elapsed_s, started)


class Feed:
    """The requests the parent sent ahead for the closed loop running now."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._ready = threading.Condition()
        self._requests: deque[Request] = deque()
        self.run_no = 0

    def begin(self, run_no: int, requests: list[Request]) -> None:
        with self._ready:
            self.run_no = run_no
            self._requests = deque(requests)

    def give(self, run_no: int, requests: list[Request]) -> None:
        with self._ready:
            if run_no == self.run_no:
                self._requests.extend(requests)
                self._ready.notify_all()

    def take(self) -> Request:
        """The next request (the loop's ``supply``); waits only if the parent fell behind."""
        with self._ready:
            while not self._requests:
                self._ready.wait(0.5)
            request = self._requests.popleft()
        self._outbox.put("took", self.run_no, 1)
        return request


@dataclasses.dataclass(frozen=True)
class LoadJob:
    """A load worker's setup. ``server_pids``: the target's server processes on this machine
    as the parent found them (``tier_run.server_finder``), so the worker's self-check judges its
    late threads on the parent's rule: while the server holds the cores, lateness is the
    server's limit, not the client's (``gpu.selfload``)."""

    recipe: ClientRecipe
    who: str  # "load worker process 1 of 2"
    wall: float  # the parent's clock anchor (``request_times.anchor``)
    mono: float
    server_pids: tuple[int, ...] = ()
    limits: CheckLimits = DEFAULT_LIMITS

    def serve(self, inbox: Channel, outbox: Outbox) -> None:
        use_anchor(self.wall, self.mono)
        outbox.put("ready", 0)
        serve(inbox, outbox, self)


def serve(inbox: Channel, outbox: Outbox, setup: LoadJob) -> None:
    """Runs, one at a time, until the parent closes the pipe; each run's result carries
    why this process was the client's limit during it ("" when it kept up)."""
    server = [setup.server_pids]  # as the parent last said: its setup, then before a run
    monitor = worker_check(setup.who, lambda: server[0], limits=setup.limits).start()
    run_no = 0

    def told(record: Record) -> None:
        outbox.put("answered", run_no)  # at work: the parent's silence limit starts again
        if not record.ok:  # the parent stops the other workers' loops
            outbox.put("failed", run_no)

    sender = Sender(HttpTransport(setup.recipe.client()), watch=told)
    feed, gos = Feed(outbox), SimpleQueue[float]()  # a wave's go: once every worker holds its part
    jobs: SimpleQueue[tuple[Any, ...]] = SimpleQueue()
    stops: dict[int, threading.Event] = {}
    listen(inbox, _told(jobs, feed, gos, stops, server))
    while True:
        job = jobs.get()
        kind, run_no = job[0], job[1]
        mark = monitor.mark()
        try:
            if kind == "closed":
                _, _, concurrency, window, max_tokens, go_at, requests = job
                stop = stops.setdefault(run_no, threading.Event())
                feed.begin(run_no, requests)
                _wait_until(go_at)
                shared = StoppableWindow(window.min_s, window.min_requests, stop)
                loop = sender.closed_loop(feed.take, concurrency, shared, max_tokens)
                outbox.put("loop", run_no, loop, monitor.bound_since(mark))
            elif kind == "wave":  # released together with the other workers' parts
                _, _, requests, max_tokens = job
                outbox.put("armed", run_no)
                _wait_until(gos.get())  # its run's: a run ends only after every worker's go
                start = time.perf_counter()
                items, wall_s = sender.send(requests, len(requests), max_tokens)
                outbox.put("wave", run_no, items, wall_s, start, monitor.bound_since(mark))
            else:
                _, _, requests, schedule, cap, max_tokens, go_at = job
                _wait_until(go_at)
                start = time.perf_counter()
                run = sender.open_loop(requests, schedule, cap, max_tokens)
                outbox.put("open", run_no, run, start, monitor.bound_since(mark))
        except Exception as exc:  # calibrate's own bug: the parent says so and stops
            outbox.put("error", run_no, f"{type(exc).__name__}: {exc}", format_traceback(exc))


def _wait_until(go_at: float) -> None:
    if (wait := go_at - time.perf_counter()) > 0:
        time.sleep(wait)


def _told(
    jobs: SimpleQueue[tuple[Any, ...]],
    feed: Feed,
    gos: SimpleQueue[float],
    stops: dict[int, threading.Event],
    server: list[tuple[int, ...]],
) -> Callable[[tuple[Any, ...]], None]:
    """What the parent's messages do: a run to start, a wave's go, more requests, a stop."""

    def handle(message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind in ("closed", "open", "wave"):
            jobs.put(message)
        elif kind == "go":
            gos.put(message[2])
        elif kind == "more":
            feed.give(message[1], message[2])
        elif kind == "stop":
            stops.setdefault(message[1], threading.Event()).set()
        elif kind == "server":
            server[0] = tuple(message[2])

    return handle


def main() -> None:
    inbox, to_parent = worker_pipes("calibrate worker")
    job: Job | None = inbox.receive()
    if job is None or not hasattr(job, "serve"):
        return  # not started by calibrate: nothing to do
    outbox = Outbox(to_parent, "worker-outbox")
    job.serve(inbox, outbox)
    outbox.close()
    os._exit(0)  # daemon threads (a listener) need not be waited for


if __name__ == "__main__":
    main()

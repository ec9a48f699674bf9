"""``WorkerSender``: a ladder's waves and a sweep's closed and open loops sent from N worker
processes, each running a ``child.LoadJob``; the request supply stays here (the workload plan
lives in this process).

- a wave of B: dealt to the workers in turn and released by all of them at one moment;
- a closed loop at C: C split as evenly as can be, each worker sent its first requests and a
  buffer ahead (``shares.ahead``), and every request it takes replaced at once, so it never
  waits on this process; an answer that fails in one worker stops the others' starting too;
- an open loop: the schedule's sends dealt in turn to the workers, the in-flight cap split.

Their runs are merged into the one a single process makes (``shares``). A worker that ends,
fails or falls silent loses the run: ``WorkerDied`` (exit 1) naming it, every worker ended.
One request (a canary, a probe) and a prompt-list wave are sent from this process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from calibrate.errors import WorkerDied
from calibrate.http.client import OpenAIClient
from calibrate.http.request_times import anchor, epoch_at
from calibrate.load.items import ItemResult
from calibrate.load.pacing import OpenRun
from calibrate.load.procs.child import LoadJob
from calibrate.load.procs.pool import ENDED, Event, WorkerPool
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.load.procs.selfcheck import (
    DEFAULT_LIMITS,
    MACHINE_SHARE,
    CheckLimits,
    first_reason,
    machine_check,
)
from calibrate.load.procs.shares import (
    ahead,
    deal,
    merge_loops,
    merge_open,
    merge_waves,
    share_windows,
    split_cap,
    split_concurrency,
    started_after,
)
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.load.transport import HttpTransport
from calibrate.load.window import LevelWindow, LoopRun

log = logging.getLogger("calibrate")
GO_S = 0.1  # every worker starts a run at the same moment, this long after it was sent
WAVE_GO_S = 0.005  # … a wave, this long after every worker said it holds its part
PARTS = ("wave", "loop", "open")  # a worker's part of a run: its self-check's reason last
QUIET_S = 60.0  # a run's workers silent this long past every request's deadline: stuck
READY_S = 60.0  # a worker that has not started within this is stuck (a loaded machine: ~1 s)
INSTEAD = "run calibrate on a faster client machine"  # the self-check's advice, cores all used
AGAIN = (
    "Nothing of this run is measured. Run it again; if a worker dies again, look for its "
    "error above and for the kernel's out-of-memory killer (dmesg), or run with --workers 1"
)


class WorkerSender(Sender):
    """A ``Sender`` whose waves and loops run in ``workers`` processes. Each worker's self-check
    reads the CPU of ``server_pids`` (the server's processes here) on ``limits``; all processes
    together, ``machine_share`` of the cores (``selfcheck``). A run was the client's limit when
    any of them was (``workers_bound_since``)."""

    def __init__(
        self,
        client: OpenAIClient,
        recipe: ClientRecipe,
        workers: int,
        server_pids: Callable[[], Iterable[int]] = tuple,
        *,
        limits: CheckLimits = DEFAULT_LIMITS,
        machine_share: float = MACHINE_SHARE,
        quiet_s: float = QUIET_S,
    ) -> None:
        super().__init__(HttpTransport(client))
        self.workers = workers
        self._recipe, self._limits, self._quiet_s = recipe, limits, quiet_s
        self._pool = WorkerPool("load-worker", server_pids)
        self._machine = machine_check(
            self._pool.pids, workers, INSTEAD, machine_share, limits.window_s
        )
        self._machine_mark = 0  # its windows before the run now running
        self._run_no = 0
        self._bound: list[str] = []  # per run: why calibrate was the limit ("": it was not)

    def workers_mark(self) -> int:
        return len(self._bound)

    def workers_bound_since(self, mark: int) -> str:
        return first_reason(self._bound[mark:])

    def close(self) -> None:
        self._machine.stop()
        self._pool.close()

    def pids(self) -> list[int]:
        """The workers' process ids (a self-check can read their CPU)."""
        return self._pool.pids()

    def send(
        self, requests: Sequence[Request], workers: int, max_tokens: int | None = None
    ) -> tuple[list[ItemResult], float]:
        """``Sender.send``: a wave of several requests dealt to the workers in turn and released
        by all of them at one moment; one request (a canary, a probe) goes from here."""
        dealt = deal(len(requests), self.workers, workers)
        if len(dealt) < 2:
            return super().send(requests, workers, max_tokens)
        run_no = self._begin()
        for k, indices in enumerate(dealt):
            self._pool.send(k, ("wave", run_no, [requests[i] for i in indices], max_tokens))
        armed: set[int] = set()
        parts: dict[int, tuple[list[ItemResult], float, float]] = {}
        go_at = 0.0

        def told(k: int, messages: list[tuple[Any, ...]]) -> None:
            nonlocal go_at
            for kind, _, *rest in messages:
                if kind == "armed":
                    armed.add(k)
                    if len(armed) == len(dealt):  # every part is where it is sent from
                        go_at = time.perf_counter() + WAVE_GO_S
                        for other in range(len(dealt)):
                            self._pool.send(other, ("go", run_no, go_at))
                elif kind == "wave":
                    parts[k] = (rest[0], rest[1], rest[2] - go_at)

        during = f"a wave of {len(requests)} requests"
        self._until(lambda: len(parts) == len(dealt), 0.0, during, told)
        return merge_waves([parts[k] for k in sorted(parts)])

    def closed_loop(
        self,
        supply: Callable[[], Request],
        concurrency: int,
        window: LevelWindow,
        max_tokens: int | None = None,
    ) -> LoopRun:
        """``Sender.closed_loop`` with C split over the workers (see the module's doc)."""
        shares = split_concurrency(concurrency, self.workers)
        run_no = self._begin()
        first = [[supply() for _ in range(ahead(share))] for share in shares]
        go_at = time.perf_counter() + GO_S
        for k, (share, part, requests) in enumerate(
            zip(shares, share_windows(window, shares), first, strict=True)
        ):
            self._pool.send(k, ("closed", run_no, share, part, max_tokens, go_at, requests))
        runs: dict[int, LoopRun] = {}
        stopped = False

        def told(k: int, messages: list[tuple[Any, ...]]) -> None:
            nonlocal stopped
            took = 0
            for kind, _, *rest in messages:
                if kind == "took" and k not in runs:
                    took += rest[0]
                elif kind == "failed" and not stopped:
                    stopped = True
                    for other in range(len(shares)):
                        if other != k:
                            self._pool.send(other, ("stop", run_no))
                elif kind == "loop":
                    runs[k] = rest[0]
            if took and k not in runs:
                self._pool.send(k, ("more", run_no, [supply() for _ in range(took)]))

        during = f"the closed loop at concurrency {concurrency}"
        self._until(lambda: len(runs) == len(shares), GO_S + window.min_s, during, told)
        started_at = epoch_at(go_at)
        return merge_loops(
            [(run, started_after(run.started_at, started_at)) for _, run in sorted(runs.items())],
            started_at,
        )

    def open_loop(
        self,
        requests: Sequence[Request],
        schedule: Sequence[float],
        cap: int | None,
        max_tokens: int | None = None,
    ) -> OpenRun:
        """``Sender.open_loop`` with the sends dealt to the workers (see the module's doc)."""
        dealt = deal(len(requests), self.workers, cap)
        caps = split_cap(cap, len(dealt))
        run_no = self._begin()
        go_at = time.perf_counter() + GO_S
        for k, indices in enumerate(dealt):
            mine = [requests[i] for i in indices]
            times = [schedule[i] for i in indices]
            self._pool.send(k, ("open", run_no, mine, times, caps[k], max_tokens, go_at))
        runs: dict[int, tuple[OpenRun, float]] = {}

        def told(k: int, messages: list[tuple[Any, ...]]) -> None:
            for kind, _, *rest in messages:
                if kind == "open":
                    runs[k] = (rest[0], rest[1] - go_at)

        last = schedule[-1] if schedule else 0.0
        self._until(lambda: len(runs) == len(dealt), GO_S + last, "the open loop", told)
        return merge_open([(run, offset, dealt[k]) for k, (run, offset) in sorted(runs.items())])

    def _begin(self) -> int:
        """A new run: the workers (and the machine's self-check) started once and told the
        server's processes; its number."""
        self._start()
        self._machine.start()  # the first run's; a started monitor goes on
        self._pool.tell_server()
        self._machine_mark = self._machine.mark()
        self._run_no += 1
        return self._run_no

    def _start(self) -> None:
        """Start the workers (once) and wait until each has built its client."""
        pool = self._pool
        if pool.procs:
            return
        told = pool.server()
        try:
            for k in range(self.workers):
                who = f"load worker process {k + 1} of {self.workers}"
                pool.start(LoadJob(self._recipe, who, *anchor(), told, self._limits))
        except OSError as exc:  # out of processes or descriptors
            started = len(pool.procs)
            pool.close()
            raise WorkerDied(
                f"could not start load worker process {started + 1} of {self.workers}: {exc}",
                "Lower --workers, or run with --workers 1",
            ) from exc
        ready: set[int] = set()
        deadline = time.monotonic() + READY_S
        while len(ready) < self.workers:
            k, messages = self._next(deadline, "its start")
            ready.update(k for m in messages if m[0] == "ready")

    def _next(self, deadline: float, during: str) -> Event:
        """The next group of messages from a worker. A worker's end, its error or no word from
        any by ``deadline`` (monotonic s) loses the run: ``WorkerDied``, every worker ended."""
        event = self._pool.next(deadline - time.monotonic())
        if event is None:
            self._pool.close()
            raise WorkerDied(
                f"the load worker processes sent nothing for too long during {during}", AGAIN
            )
        k, messages = event
        name = f"load worker process {k + 1} of {self.workers}"
        for message in messages:
            if message is ENDED:
                proc = self._pool.procs[k]
                how = f"(PID {proc.pid}) {proc.how_it_ended()}"
                self._pool.close()
                raise WorkerDied(f"{name} {how} during {during}", AGAIN)
            if message[0] == "error":
                log.error("load worker process %d: %s", k + 1, message[3])  # its traceback
                self._pool.close()
                raise WorkerDied(
                    f"{name} failed during {during}: {message[2]}",
                    "This is calibrate's own bug (its traceback is above): run with --workers 1 "
                    "and report it",
                )
        return k, messages

    def _until(
        self,
        done: Callable[[], bool],
        runs_s: float,
        during: str,
        told: Callable[[int, list[tuple[Any, ...]]], None],
    ) -> None:
        """Each group of the workers' words of this run to ``told`` (a late word of an earlier
        run is dropped) until ``done()``; ``runs_s``: how long the run is planned to last. A
        worker's death, a silence past every request's deadline, or Ctrl-C ends every worker:
        none goes on sending. Every answer is a word (``child``): a run longer than planned —
        slow answers, sends a cap holds back — goes on while its workers are at work. Then why
        calibrate was the limit during the run: a worker's reason (the last field of its part),
        or all of calibrate's processes together on the machine's cores ("" when neither)."""
        silence_s = self.transport.timeout_s * 2 + self._quiet_s
        deadline = time.monotonic() + runs_s + silence_s
        bound: list[str] = []
        try:
            while not done():
                k, messages = self._next(deadline, during)
                deadline = max(deadline, time.monotonic() + silence_s)
                mine = [m for m in messages if m[1] == self._run_no]
                bound += [m[-1] for m in mine if m[0] in PARTS]
                told(k, mine)
        except BaseException:
            self._pool.close()
            raise
        self._bound.append(first_reason([*bound, self._machine.bound_since(self._machine_mark)]))

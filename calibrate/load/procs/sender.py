"""``WorkerSender``: the sweep's closed and open loops sent from N processes (SPEC §12).

One Python process gets about one core of Python work; against a fast server that core, not
the server, sets the pace. This ``Sender`` keeps the request supply here (the workload plan
lives in this process) and runs each loop in N worker processes (``child.py``):

- a closed loop at C: C split as evenly as can be (``shares.split_concurrency``), each worker
  keeping its share in flight with the ordinary engine; it is sent its first requests and
  a buffer ahead, and every request it takes is replaced at once, so it never waits on this
  process for the next. An answer that fails in one worker stops the others' starting too
  (one process stops its loop then). The window's edges are merged as one process has them:
  full when the last worker had its share started, the drain from the first that stopped;
- an open loop: the schedule's sends dealt in turn to the workers, the in-flight cap split.

Items come back as ``ItemResult``s, shifted onto this process's start and numbered in the
order the requests started, so the stage above sees what one process would have made. A
worker that dies is a ``WorkerDied`` (exit 1) naming it, and the others are ended. A ladder's
wave of B is dealt to the workers too and released by all at one moment; everything else (a
prompt-list wave, the canary, the copies, the probes) is still sent from this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from calibrate.http.client import OpenAIClient
from calibrate.http.request_times import epoch_at
from calibrate.load.items import ItemResult
from calibrate.load.pacing import OpenRun
from calibrate.load.procs.pool import WorkerPool
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.load.procs.selfcheck import (
    DEFAULT_LIMITS,
    MACHINE_SHARE,
    CheckLimits,
    first_reason,
    machine_check,
)
from calibrate.load.procs.shares import (
    deal,
    merge_loops,
    merge_open,
    merge_waves,
    share_windows,
    split_cap,
    split_concurrency,
)
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.load.transport import HttpTransport
from calibrate.load.window import LevelWindow, LoopRun

GO_S = 0.1  # every worker starts a run at the same moment, this long after it was sent
WAVE_GO_S = 0.005  # … a wave, this long after every worker said it holds its part
AHEAD_MIN = 8  # requests a worker holds beyond its share in flight, at least
QUIET_S = 60.0  # a run's workers silent this long past every request's deadline: stuck
INSTEAD = "run calibrate on a faster client machine"  # the self-check's advice, cores all used


def ahead(share: int) -> int:
    """Requests sent to a worker before its loop starts: its share, and as many again (at
    least ``AHEAD_MIN``) so that a burst of answers never waits on this process."""
    return share + max(share, AHEAD_MIN)


class WorkerSender(Sender):
    """A ``Sender`` whose waves and closed and open loops run in ``workers`` processes; each
    worker's self-check reads the CPU of ``server_pids`` (the server's processes on this
    machine) and judges on ``limits``; all of calibrate's processes together are judged against
    the machine's cores (``machine_share`` of them, in the same windows:
    ``selfcheck.machine_check``). A run was the client's limit when any of them was
    (``workers_bound_since``)."""

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
        self._quiet_s = quiet_s
        self._pool = WorkerPool(recipe, workers, server_pids, limits)
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
        bound: list[str] = []
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
                    bound.append(rest[3])

        during = f"a wave of {len(requests)} requests"
        self._until(lambda: len(parts) == len(dealt), 0.0, during, told)
        self._ended(bound)
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
        bound: list[str] = []
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
                    bound.append(rest[1])
            if took and k not in runs:
                self._pool.send(k, ("more", run_no, [supply() for _ in range(took)]))

        during = f"the closed loop at concurrency {concurrency}"
        self._until(lambda: len(runs) == len(shares), GO_S + window.min_s, during, told)
        self._ended(bound)
        started_at = epoch_at(go_at)
        return merge_loops(
            [(run, _offset(run.started_at, started_at)) for _, run in sorted(runs.items())],
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
        bound: list[str] = []

        def told(k: int, messages: list[tuple[Any, ...]]) -> None:
            for kind, _, *rest in messages:
                if kind == "open":
                    runs[k] = (rest[0], rest[1] - go_at)
                    bound.append(rest[2])

        last = schedule[-1] if schedule else 0.0
        self._until(lambda: len(runs) == len(dealt), GO_S + last, "the open loop", told)
        self._ended(bound)
        return merge_open([(run, offset, dealt[k]) for k, (run, offset) in sorted(runs.items())])

    def _begin(self) -> int:
        """A new run: the workers (and the machine's self-check) started once and told the
        server's processes; its number."""
        self._pool.start()
        self._machine.start()  # the first run's; a started monitor goes on
        self._pool.tell_server()
        self._machine_mark = self._machine.mark()
        self._run_no += 1
        return self._run_no

    def _ended(self, workers: Sequence[str]) -> None:
        """A run's end: why calibrate was the limit during it — a worker's reason, or all of
        calibrate's processes together on the machine's cores ("" when neither)."""
        self._bound.append(first_reason([*workers, self._machine.bound_since(self._machine_mark)]))

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
        slow answers, sends a cap holds back — goes on while its workers are at work."""
        silence_s = self.transport.timeout_s * 2 + self._quiet_s
        deadline = time.monotonic() + runs_s + silence_s
        try:
            while not done():
                k, messages = self._pool.next_event(deadline, during)
                deadline = max(deadline, time.monotonic() + silence_s)
                told(k, [m for m in messages if m[1] == self._run_no])
        except BaseException:
            self._pool.close()
            raise


def _offset(child_started_at: float | None, started_at: float) -> float:
    """A worker's start after this process's, in s (both epoch stamps on one anchor)."""
    return child_started_at - started_at if child_started_at is not None else 0.0

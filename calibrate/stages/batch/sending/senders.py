"""What sends a run's items, as the one run loop (items.py) drives it: the ``Senders``
protocol, and its one-process form ``Sending`` — each endpoint's lane (lanes.py) driven by the
engine under its work-queue policy (pacing.py) on this process's I/O loop, at most the
endpoint's concurrency in flight (never more than items). ``local_senders`` makes it for a run;
a worker process of ``--workers N`` drives its share of the slots with it (worker.py), and
the parent's ``Senders`` are ``workers.worker_senders``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from calibrate.gpu.selfload import SelfLoadReport
from calibrate.http.aio.bridge import shared_loop
from calibrate.load.engine import drive
from calibrate.load.transport import LoopClock
from calibrate.stages.batch.journal import Journal, Tally
from calibrate.stages.batch.plan import BatchSpec
from calibrate.stages.batch.sending.control import BatchControl, ReachabilityGuard
from calibrate.stages.batch.sending.lanes import EndpointReport, Lane, report
from calibrate.stages.batch.sending.pacing import ItemPacing, Work
from calibrate.stages.batch.sending.queue import WorkQueue

log = logging.getLogger("calibrate")

POLL_S = 0.2  # how soon a Ctrl-C, an ended sender or a progress line is noticed


class Sending:
    """The lanes' drives under way on ``clock``'s loop, in this process: started, watched,
    ended (the ``Senders`` of a one-process run, and of each worker process's)."""

    def __init__(self, lanes: Sequence[Lane], work: Work) -> None:
        self.lanes = lanes
        self._control = work.control
        self.policies = [ItemPacing(lane, lanes, work) for lane in lanes]
        self.clock = LoopClock()  # the process's I/O loop: every item is sent from it
        self._future: concurrent.futures.Future[None] | None = None

    def in_flight(self) -> int:
        """Items being worked on (read from another thread: a progress line's figure)."""
        return sum(p.in_flight for p in self.policies)

    def start(self) -> None:
        self._future = self.clock.start(self._drives())

    async def _drives(self) -> None:
        async with asyncio.TaskGroup() as group:  # a bug in one ends them all
            for lane, pacing in zip(self.lanes, self.policies, strict=True):
                run = drive(iter(()), pacing, lane.transport, self.clock, itemize=False, keep=False)
                group.create_task(run)

    def settle(self, timeout_s: float) -> bool:
        """True once every drive is over. A bug of calibrate's own in one (the policy, not an
        item: an item's is its ``internal`` line) ends them all and stops the run as
        ``internal``: recorded as failed, its unanswered items left to the rerun."""
        assert self._future is not None, "start first"
        try:
            self._future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            return False
        except Exception as exc:
            first = exc.exceptions[0] if isinstance(exc, BaseExceptionGroup) else exc
            log.error("batch: sending the items failed", exc_info=first)
            why = f"calibrate's own error while sending the items: {type(first).__name__}: {first}"
            self._control.fail("internal", why)
        return True

    def stop(self) -> None:
        """Nothing to tell: the policies take no item once the queue is closed."""

    def abandon(self) -> int:
        """Stop waiting for what is in flight (its requests are cancelled); how many."""
        count = self.in_flight()
        if self._future is not None:
            self._future.cancel()
        return count

    def down(self, now_s: float) -> tuple[tuple[str, float], ...]:
        return tuple(
            (lane.label, s) for lane in self.lanes if (s := lane.breaker.down_for_s()) is not None
        )

    def warnings(self) -> list[str]:
        return []

    def close(self) -> None:
        """Nothing left: the drives ended, or were cancelled by ``abandon``."""

    def selfload(self, own: SelfLoadReport | None) -> SelfLoadReport | None:
        return own

    def endpoints(self, tally: Tally, elapsed_s: float) -> tuple[EndpointReport, ...]:
        return tuple(
            report(lane, tally.done_at[lane.label], tally.failed_at[lane.label], elapsed_s)
            for lane in self.lanes
        )


class Senders(Protocol):
    """What sends a run's items, in this process (``Sending``) or in worker processes
    (``workers.py``), as the one run loop (``run_items``) drives it: ``settle`` waits up to
    ``timeout_s`` and is True once the sending is over; ``stop`` is called on every turn once
    stopping (send no new item); ``abandon``, past the grace period, gives up what is in flight
    and says how many items that was; ``down``: the endpoints in an outage and for how long;
    ``warnings``: what to show since last asked; ``close``: the run is ending, whatever
    happened; ``selfload``: this process's self-check (``own``) with the senders' merged in."""

    def start(self) -> None: ...
    def settle(self, timeout_s: float) -> bool: ...
    def stop(self) -> None: ...
    def abandon(self) -> int: ...
    def in_flight(self) -> int: ...
    def down(self, now_s: float) -> tuple[tuple[str, float], ...]: ...
    def warnings(self) -> list[str]: ...
    def close(self) -> None: ...
    def selfload(self, own: SelfLoadReport | None) -> SelfLoadReport | None: ...
    def endpoints(self, tally: Tally, elapsed_s: float) -> tuple[EndpointReport, ...]: ...


SendersOf = Callable[[WorkQueue, Journal, int], Senders]  # from the run's queue, journal, slots


def local_senders(lanes: Sequence[Lane], spec: BatchSpec, control: BatchControl) -> SendersOf:
    """The senders of a run in this process: the lanes' drives (``Sending``). The process's
    I/O loop is started here, with the run's other start-up (uvloop imported, its thread
    running: ~10 ms), not inside the run as its first item is sent: the run's time and CPU
    are its items'."""
    shared_loop()

    def sending(queue: WorkQueue, journal: Journal, slots: int) -> Sending:
        guard = ReachabilityGuard(
            slots,
            lambda detail: control.fail("unreachable", detail),
            lambda detail: control.fail("unknown_model", detail),
        )
        return Sending(lanes, Work(queue, spec, journal, control, guard))

    return sending

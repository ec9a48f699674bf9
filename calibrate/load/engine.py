"""The load engine (SPEC §12): one coroutine drives requests from a source under a pacing
policy over a transport, on a clock, and hands back one record per request.

    drive(source, pacing, transport, clock) -> Drive(records)

- **source**: an iterator of ``Request``s (a wave's list, the sweep's endless supply, a
  schedule's requests, a job's items);
- **pacing**: *when* to send — the only thing that differs between the ladder's wave, the
  sweep's closed loop and its open loop (``load.pacing``: ``Wave``, ``Closed``, ``Open``);
- **transport**: *how* one request is sent and its answer read (``load.transport``: the asyncio
  HTTP transport, or the simulated server of ``load.sim``);
- **clock**: *when it is*, and the event loop the run goes on (the process's I/O loop on the
  monotonic clock, or a virtual loop whose time jumps to the next event).

The loop asks the policy what to do — ``Send`` (the source's next request, or one the policy
names), ``Wait`` (until a time, or until an answer) or ``Done`` (nothing more: drain) — and
tells it each answer (``answered``) and the source's end (``ran_out``). It keeps no state of
its own beyond what is in flight, so every load shape is a policy and every policy gets the
same timing: ``sent_s`` when the request left, and the transport's own stamps of the first
token and the finish, taken as the bytes arrive (the asyncio transport parses streams off the
loop, so a parse never delays another stream's stamps). A request still unanswered past its
transport's ``timeout_s`` plus a grace is a recorded failure, never dropped.

A new load shape is a new policy, never a new loop. A work queue of C with retries, the
outage breaker and the journal hook (``batch``) is one: ``next`` says ``Send(request)`` with a
retried item's request once its backoff is over, ``Send()`` for a fresh one while fewer than C
are in flight, ``Wait(until)`` while the breaker holds sends back (or a backoff runs) and
``Done`` once the source ``ran_out`` and no retry is due; ``answered`` writes the journal line
of a finished item (or schedules its retry) and feeds the breaker. A stop asked from another
thread (Ctrl-C) is seen at the policy's next ``Wait(until)``: a policy that must notice one
promptly waits in short steps.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from calibrate.errors import ErrorInfo, RequestError
from calibrate.http.request_times import epoch_at
from calibrate.load.answers import items_of, stuck_items
from calibrate.load.items import ItemResult
from calibrate.load.request import Request
from calibrate.load.transport import Clock, Exchange, Transport

GRACE_S = 30.0  # past a transport's own deadline: the request is stuck, recorded as failed


@dataclass(frozen=True)
class Send:
    """Send a request now: ``request``, or the source's next when None."""

    request: Request | None = None


@dataclass(frozen=True)
class Wait:
    """Send nothing until ``until_s`` (seconds since the run began) or the next answer,
    whichever comes first (None: the next answer)."""

    until_s: float | None = None


@dataclass(frozen=True)
class Done:
    """Send nothing more; the run ends once what is in flight is answered."""


Step = Send | Wait | Done
SEND, WAIT, DONE = Send(), Wait(), Done()


@dataclass(frozen=True)
class Record:
    """One request's outcome: its items (one per prompt, failures too), numbered in send
    order, with when it was sent and answered in seconds since the run began."""

    number: int
    request: Request
    items: tuple[ItemResult, ...]
    sent_s: float
    done_s: float
    exchange: Exchange | None = None  # the answer as the transport gave it (``itemize`` off)

    @property
    def ok(self) -> bool:
        return all(item.ok for item in self.items)


@dataclass(frozen=True)
class Drive:
    """What one run made: every record in the order answered, and its clock."""

    records: tuple[Record, ...]
    start: float  # the clock's reading when the run began
    total_s: float  # from the start to the last answer

    @property
    def started_at(self) -> float:
        """The run's start in epoch seconds (on the requests' own line, SPEC §4.1)."""
        return epoch_at(self.start)

    @property
    def items(self) -> tuple[ItemResult, ...]:
        """Every item, in item order."""
        return tuple(sorted((i for r in self.records for i in r.items), key=lambda i: i.index))


class Pacing(Protocol):
    """When to send: the engine asks ``next`` whenever something changed (a send, an
    answer, a wait ended) and tells it every answer. ``now_s`` is seconds since the run began."""

    def next(self, now_s: float, in_flight: int) -> Step: ...

    def answered(self, record: Record, now_s: float) -> None: ...

    def ran_out(self, now_s: float) -> None:
        """The source has no more requests (a ``Send()`` found none)."""
        ...


class _Run:
    """The state of one ``drive`` on the loop: what is in flight, the answers not yet told."""

    def __init__(
        self, transport: Transport, clock: Clock, max_tokens: int | None, itemize: bool
    ) -> None:
        self.transport = transport
        self.clock = clock
        self.max_tokens = max_tokens
        self.itemize = itemize
        self.start = clock.now()
        self.loop = asyncio.get_running_loop()
        # by number (each request's own, in send order): its task, request and send time
        self.in_flight: dict[int, tuple[asyncio.Task[None], Request, float]] = {}
        self.order: collections.deque[tuple[float, int]] = collections.deque()
        self.answers: collections.deque[Record] = collections.deque()
        self.waker: asyncio.Future[None] | None = None
        self.guard_s = transport.timeout_s + GRACE_S

    def since(self) -> float:
        return self.clock.now() - self.start

    def send(self, number: int, request: Request) -> None:
        sent = self.clock.now()
        task = self.loop.create_task(self._one(number, request, sent))
        self.in_flight[number] = (task, request, sent)
        self.order.append((sent + self.guard_s, number))

    async def _one(self, number: int, request: Request, sent: float) -> None:
        try:
            exchange = await self.transport.send(request)
        except Exception as exc:  # a transport's own bug: the request's failure all the same
            exchange = Exchange(None, exc)
        self.in_flight.pop(number, None)  # by its number: no current_task() to find it
        done = self.clock.now()
        started_s, done_s = sent - self.start, done - self.start
        if not self.itemize:  # the policy reads the answer itself (batch: its result line)
            self.tell(Record(number, request, (), started_s, done_s, exchange))
            return
        items = items_of(
            request,
            exchange.completion,
            exchange.failure,
            exchange.context,
            started_s,
            done_s,
            self.max_tokens,
            sent,
            done,
        )
        self.tell(Record(number, request, tuple(items), started_s, done_s))

    def tell(self, record: Record) -> None:
        self.answers.append(record)
        waker = self.waker
        if waker is not None and not waker.done():
            waker.set_result(None)

    def stuck(self, now: float) -> float | None:
        """Cancel and record every request past its guard; the next guard's time, if any."""
        order = self.order
        while order:
            deadline, number = order[0]
            if number not in self.in_flight:
                order.popleft()
                continue
            if deadline > now:
                return deadline
            order.popleft()
            task, request, sent = self.in_flight.pop(number)
            task.cancel()
            started_s, now_s = sent - self.start, now - self.start
            if not self.itemize:
                stuck = RequestError(
                    ErrorInfo("timeout", f"no answer within {now_s - started_s:.0f} s")
                )
                self.tell(Record(number, request, (), started_s, now_s, Exchange(None, stuck)))
                continue
            items = stuck_items(request, started_s, now_s, sent, now)
            self.tell(Record(number, request, tuple(items), started_s, now_s))
        return None

    async def wait(self, until_s: float | None) -> None:
        """Until an answer is in, or ``until_s``, or the next request's guard."""
        now = self.clock.now()
        guard = self.stuck(now)
        if self.answers:
            return
        until = self.start + until_s if until_s is not None else None
        if guard is not None:
            until = guard if until is None else min(until, guard)
        self.waker = self.loop.create_future()
        timer = None
        if until is not None:
            timer = self.loop.call_later(max(0.0, until - now), _wake, self.waker)
        try:
            await self.waker
        finally:
            self.waker = None
            if timer is not None:
                timer.cancel()

    def cancel(self) -> None:
        for task, _, _ in self.in_flight.values():
            task.cancel()


def _wake(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)


async def drive(
    source: Iterator[Request],
    pacing: Pacing,
    transport: Transport,
    clock: Clock,
    *,
    max_tokens: int | None = None,
    itemize: bool = True,
    keep: bool = True,
) -> Drive:
    """Send ``source``'s requests as ``pacing`` says over ``transport``; every record once the
    policy is done and nothing is in flight (``max_tokens``: what an answer's length is judged
    against). Must run on ``clock``'s loop (``clock.run``).

    A run of millions (a batch) keeps nothing: ``keep`` off, the records are only told to the
    policy; ``itemize`` off, each record holds its ``exchange`` and no items (the policy reads
    the answer its own way, and no CPU goes into items nobody reads)."""
    run = _Run(transport, clock, max_tokens, itemize)
    records: list[Record] = []
    number = 0
    try:
        while True:
            # in flight until the policy is told of its answer
            step = pacing.next(run.since(), len(run.in_flight) + len(run.answers))
            if isinstance(step, Send):
                request = step.request if step.request is not None else next(source, None)
                if request is None:
                    pacing.ran_out(run.since())
                else:
                    number += 1
                    run.send(number, request)
                continue
            if isinstance(step, Done) and not run.in_flight and not run.answers:
                break
            if not run.answers:
                await run.wait(step.until_s if isinstance(step, Wait) else None)
            if run.answers:
                record = run.answers.popleft()
                if keep:
                    records.append(record)
                pacing.answered(record, run.since())
    finally:
        run.cancel()  # cancelled (Ctrl-C) or a bug: nothing goes on sending
    return Drive(tuple(records), run.start, run.since())

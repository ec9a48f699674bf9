"""A batch's work-queue policy (stages/batch/sending/pacing.py) driven by the real engine on a virtual
clock: what a user of ``calibrate batch`` would see of its slots, retries, outages and stops,
with every time arithmetic (a run of minutes takes milliseconds, the same on a busy machine)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibrate.errors import ErrorInfo, RequestError
from calibrate.http.client import OpenAIClient
from calibrate.http.models import Choice, Completion, SamplingParams, Usage
from calibrate.io.tasks import ItemId, Task
from calibrate.load.engine import drive
from calibrate.load.request import Request
from calibrate.load.retry import RetryPolicy
from calibrate.load.sim.clock import VirtualClock
from calibrate.load.transport import Exchange
from calibrate.stages.batch.plan import BatchSpec
from calibrate.stages.batch.sending.control import BatchControl, ReachabilityGuard
from calibrate.stages.batch.sending.lanes import Lane
from calibrate.stages.batch.sending.outage import Breaker, OutagePolicy
from calibrate.stages.batch.sending.pacing import ItemPacing, Work
from calibrate.state.setting import Endpoint

ANSWER = Completion((Choice(0, "four", "stop"),), Usage(3, 1, 4), "m", None, 0.01)
URL = "http://scripted.invalid/v1"

Outcome = Completion | BaseException | None  # None: never answered


class Server:
    """A transport on the virtual clock: each item answered after ``service_s`` with what
    ``script(item, attempt)`` says; it keeps when each attempt began and ended."""

    def __init__(
        self,
        clock: VirtualClock,
        script: Callable[[str, int], Outcome] = lambda item, n: ANSWER,
        service_s: float = 1.0,
    ) -> None:
        self.clock = clock
        self.script = script
        self.service_s = service_s
        self.timeout_s = 60.0
        self.attempts: dict[str, list[tuple[float, float]]] = {}
        self.running = 0
        self.most_running = 0

    async def send(self, request: Request) -> Exchange:
        item = request.body["messages"][0]["content"]
        began = self.clock.now()
        tries = self.attempts.setdefault(item, [])
        tries.append((began, began))
        outcome = self.script(item, len(tries))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            if outcome is None:
                await asyncio.sleep(10 * self.timeout_s)  # cancelled by the engine's guard
            await asyncio.sleep(self.service_s)
        finally:
            self.running -= 1
        tries[-1] = (began, self.clock.now())
        if isinstance(outcome, BaseException):
            return Exchange(None, outcome)
        return Exchange(outcome)


class Items:
    """The queue a lane sees: items waiting, those put back, and which ones left; idle only
    ``lag_s`` after the last item left (the feeder thread hears of it a moment later)."""

    def __init__(self, *ids: str, clock: VirtualClock | None = None, lag_s: float = 0.0) -> None:
        self.waiting = [Task(i, i, None, 0) for i in ids]
        self.out = 0
        self.left: list[ItemId] = []
        self.put_back: list[ItemId] = []
        self.clock, self.lag_s, self.left_at = clock, lag_s, 0.0

    def idle(self) -> bool:
        now = self.clock.now() if self.clock is not None else 0.0
        return not self.waiting and self.out == 0 and now >= self.left_at + self.lag_s

    def take_waiting(self) -> Task | None:
        if not self.waiting:
            return None
        self.out += 1
        return self.waiting.pop(0)

    def finished(self, task: Task) -> None:
        self.out -= 1
        self.left.append(task.id)
        self.left_at = self.clock.now() if self.clock is not None else 0.0

    def put_back_item(self, task: Task) -> bool:
        self.out -= 1
        self.put_back.append(task.id)
        self.waiting.append(task)
        return True


class Lines:
    """The journal a lane sees: the lines it was handed; backlogged until ``backlog_until_s``."""

    def __init__(self, clock: VirtualClock, backlog_until_s: float = 0.0) -> None:
        self.clock = clock
        self.lines: list[dict[str, Any]] = []
        self.at_s: list[float] = []
        self.backlog_until_s = backlog_until_s
        self.waits: list[bool] = []

    @property
    def backlogged(self) -> bool:
        return bool(self.lines) and self.clock.now() < self.backlog_until_s

    def record(
        self, line: dict[str, Any], text: Any, tokens: int, endpoint: str, *, wait: bool = True
    ) -> None:
        self.lines.append(line)
        self.at_s.append(self.clock.now())
        self.waits.append(wait)

    def by_id(self) -> dict[str, dict[str, Any]]:
        return {line["id"]: line for line in self.lines}


def run(
    server: Server,
    items: Items,
    lines: Lines,
    *,
    concurrency: int,
    retry: RetryPolicy | None = None,
    after: int = 5,
    control: BatchControl | None = None,
) -> tuple[BatchControl, Lane, ReachabilityGuard]:
    """One lane of ``concurrency`` slots over ``server`` until the items run out."""
    control = control or BatchControl()
    breaker = Breaker(URL, OutagePolicy(after=after), lambda: None)  # its probe: "up" at once
    lane = Lane(Endpoint(URL, concurrency, "spec"), OpenAIClient(URL), breaker, server)
    guard = ReachabilityGuard(concurrency, lambda detail: control.fail("unreachable", detail))
    spec = BatchSpec(
        Path("in.jsonl"),
        Path("out.jsonl"),
        "m",
        SamplingParams(0.0, 8, 1.0, None),
        retry=retry or RetryPolicy(retries=0),
    )
    pacing = ItemPacing(lane, [lane], Work(items, spec, lines, control, guard))
    server.clock.run(drive(iter(()), pacing, server, server.clock, itemize=False, keep=False))
    return control, lane, guard


def test_c_slots_keep_c_items_in_flight_and_every_item_gets_one_line() -> None:
    clock = VirtualClock()
    server, items, lines = Server(clock), Items(*(f"t{i}" for i in range(10))), Lines(clock)
    run(server, items, lines, concurrency=3)
    assert server.most_running == 3
    assert sorted(items.left) == sorted(f"t{i}" for i in range(10)) and items.idle()
    assert all(line["ok"] and line["attempts"] == 1 for line in lines.lines)
    assert len(lines.by_id()) == 10
    # four rounds of one second: each freed slot takes the next item at once
    assert 4.0 <= clock.now() < 4.1
    assert lines.waits == [False] * 10, "the loop never waits for the journal"


def test_the_run_ends_as_soon_as_the_last_answer_is_in_not_a_poll_later() -> None:
    """A lane with nothing left to send looks for items less and less often through a long
    tail of answers; the last answer makes it look again at once (a batch's time was 3 % over
    the reference's at c=32 while it waited out one 50 ms look at the end)."""
    clock = VirtualClock()
    server = Server(clock, service_s=1.0)
    items = Items(*(f"t{i}" for i in range(10)), clock=clock, lag_s=0.0005)
    run(server, items, Lines(clock), concurrency=3)
    assert sorted(items.left) == sorted(f"t{i}" for i in range(10))
    assert 4.0 <= clock.now() < 4.005, clock.now()


def test_a_transient_failure_is_retried_after_its_backoff_and_keeps_its_slot() -> None:
    clock = VirtualClock()
    timeout = RequestError(ErrorInfo("timeout", "no answer within 60 s"))
    server = Server(clock, lambda item, n: timeout if (item, n) == ("a", 1) else ANSWER)
    items, lines = Items("a", "b"), Lines(clock)
    run(server, items, lines, concurrency=1, retry=RetryPolicy(retries=3, base_s=2, jitter=0))
    (first_end, second_start) = (server.attempts["a"][0][1], server.attempts["a"][1][0])
    assert second_start - first_end >= 2.0, "sent again before its backoff was over"
    assert server.attempts["b"][0][0] >= server.attempts["a"][1][1], (
        "another item took the slot while a waited to retry"
    )
    line = lines.by_id()["a"]
    assert line["ok"] and line["attempts"] == 2 and line["retried"] == ["timeout"]


def test_a_failure_that_is_not_transient_is_the_items_line_at_once() -> None:
    clock = VirtualClock()
    bad = RequestError(ErrorInfo("http_4xx", "400 bad request", status=400))
    server = Server(clock, lambda item, n: bad if item == "a" else ANSWER)
    items, lines = Items("a", "b"), Lines(clock)
    run(server, items, lines, concurrency=2, retry=RetryPolicy(retries=3))
    assert len(server.attempts["a"]) == 1
    line = lines.by_id()["a"]
    assert not line["ok"] and line["error"]["kind"] == "http_4xx" and line["attempts"] == 1
    assert lines.by_id()["b"]["ok"]


def test_an_outage_puts_its_items_back_and_their_attempts_do_not_count() -> None:
    clock = VirtualClock()
    reset = RequestError(ErrorInfo("reset", "connection reset by peer"))
    server = Server(clock, lambda item, n: reset if n == 1 and item != "first" else ANSWER)
    items, lines = Items("first", "a", "b"), Lines(clock)
    _, lane, _ = run(server, items, lines, concurrency=1, after=1, retry=RetryPolicy(retries=3))
    assert items.put_back == ["a", "b"], "each item the outage met went back to the queue"
    assert lane.breaker.incidents == 2 and lane.breaker.state == "up"
    by_id = lines.by_id()
    assert all(by_id[i]["ok"] and by_id[i]["attempts"] == 1 for i in ("a", "b"))
    assert len(lines.lines) == 3


def test_a_stop_sends_nothing_more_records_what_is_in_flight_and_leaves_retries_to_the_rerun() -> (
    None
):
    clock = VirtualClock()
    control = BatchControl()
    timeout = RequestError(ErrorInfo("timeout", "no answer"))

    def script(item: str, n: int) -> Outcome:
        if item == "a":
            return timeout  # waits out a backoff when the stop comes
        if item == "b":
            control.fail("interrupted", "")
        return ANSWER

    server = Server(clock, script)
    items, lines = Items("a", "b", "c", "d"), Lines(clock)
    run(
        server,
        items,
        lines,
        concurrency=2,
        retry=RetryPolicy(retries=3, base_s=30),
        control=control,
    )
    assert [line["id"] for line in lines.lines] == ["b"], "the item in flight is recorded"
    assert "a" in items.left, "the retry is left to the rerun, without a line"
    assert [t.id for t in items.waiting] == ["c", "d"], "nothing sent after the stop"


def test_a_backlogged_journal_holds_the_sends_back_without_blocking_the_loop() -> None:
    clock = VirtualClock()
    server, items, lines = Server(clock), Items("a", "b", "c"), Lines(clock, backlog_until_s=7.5)
    run(server, items, lines, concurrency=1)
    assert server.attempts["b"][0][0] >= 7.5, "sent while the journal was backlogged"
    assert len(lines.lines) == 3 and lines.waits == [False] * 3


def test_refused_before_anything_answered_ends_the_run_and_fails_no_item() -> None:
    clock = VirtualClock()
    refused = RequestError(ErrorInfo("connect", "connection refused"))
    server = Server(clock, lambda item, n: refused)
    items, lines = Items(*(f"t{i}" for i in range(6))), Lines(clock)
    control, _, guard = run(server, items, lines, concurrency=2, retry=RetryPolicy(retries=0))
    assert control.reason == "unreachable" and not guard.answered
    assert "nothing ever answered" in control.detail
    assert lines.lines == [], "no item was marked failed"


def test_a_request_never_answered_is_its_items_timeout_not_a_hang() -> None:
    clock = VirtualClock()
    server = Server(clock, lambda item, n: None if item == "a" else ANSWER)
    items, lines = Items("a", "b"), Lines(clock)
    run(server, items, lines, concurrency=2)
    line = lines.by_id()["a"]
    assert not line["ok"] and line["error"]["kind"] == "timeout"
    assert lines.by_id()["b"]["ok"] and items.idle()


def test_anything_that_goes_wrong_reading_an_answer_is_the_items_internal_failure() -> None:
    clock = VirtualClock()
    server = Server(clock, lambda item, n: ValueError("no") if item == "a" else ANSWER)
    not_an_answer = Server(clock, lambda item, n: "text")  # type: ignore[arg-type,return-value]
    items, lines = Items("a", "b"), Lines(clock)
    run(server, items, lines, concurrency=2)
    assert lines.by_id()["a"]["error"]["kind"] == "internal"
    assert "ValueError" in lines.by_id()["a"]["error"]["message"]
    items, lines = Items("c"), Lines(clock)
    run(not_an_answer, items, lines, concurrency=1)
    assert lines.by_id()["c"]["error"]["kind"] == "internal" and items.left == ["c"]

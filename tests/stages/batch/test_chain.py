"""A slot's chain (stages/batch/chain.py): items sent back to back from the loop, and every case
in which it hands the slot's thread an item or stops — with scripted answers on a fake loop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import pytest

from calibrate.errors import ErrorInfo, RequestError
from calibrate.http.models import Choice, Completion, SamplingParams, Usage
from calibrate.io.tasks import ItemId, Task
from calibrate.stages.batch import chain as chain_module
from calibrate.stages.batch.chain import Chain
from calibrate.stages.batch.lanes import Lane
from calibrate.stages.batch.outage import Breaker, OutagePolicy
from calibrate.stages.batch.plan import BatchSpec
from calibrate.stages.batch.worker import BatchControl, ReachabilityGuard
from calibrate.state.setting import Endpoint

Done = Callable[[Completion | None, BaseException | None], None]
ANSWER = Completion((Choice(0, "four", "stop"),), Usage(3, 1, 4), "m", None, 0.01)


class FakeLoop:
    """One thread that runs what is handed to it, in order: the I/O loop's stand-in."""

    def __init__(self) -> None:
        self.jobs: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()


class ScriptedClient:
    """Submits to the fake loop; each request is answered as ``script`` says for its item
    (an answer by default, a ``RequestError`` or ``"never"`` — a stuck loop)."""

    base_url = "http://scripted.invalid/v1"
    timeout_s = 0.05

    def __init__(self, loop: FakeLoop, script: dict[str, Any] | None = None) -> None:
        self.loop = loop
        self.script = script or {}
        self.sent: list[str] = []
        self.threads: set[str] = set()
        self.stuck: list[Done] = []

    def chat_body(self, model: str, message: str, params: SamplingParams) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": message}]}

    def submit_completion(self, path: str, body: dict[str, Any], done: Done) -> float:
        item = body["messages"][0]["content"]
        self.sent.append(item)
        self.threads.add(threading.current_thread().name)
        outcome = self.script.get(item, ANSWER)
        if outcome == "never":
            self.stuck.append(done)
        elif isinstance(outcome, BaseException):
            self.loop.jobs.put(lambda: done(None, outcome))
        else:
            self.loop.jobs.put(lambda: done(outcome, None))
        return 0.0


class Items:
    """The queue a chain sees: items waiting, and which ones left."""

    def __init__(self, *ids: str) -> None:
        self.waiting = [_task(i) for i in ids]
        self.left: list[ItemId] = []

    def take_waiting(self) -> Task | None:
        return self.waiting.pop(0) if self.waiting else None

    def finished(self, task: Task) -> None:
        self.left.append(task.id)


class Lines:
    """The journal a chain sees: the lines it was handed (and whether it was asked to wait)."""

    def __init__(self, backlog_after: int | None = None) -> None:
        self.lines: list[dict[str, Any]] = []
        self.waits: list[bool] = []
        self._backlog_after = backlog_after

    @property
    def backlogged(self) -> bool:
        return self._backlog_after is not None and len(self.lines) >= self._backlog_after

    def record(
        self, line: dict[str, Any], text: Any, tokens: int, endpoint: str, *, wait: bool = True
    ) -> None:
        self.lines.append(line)
        self.waits.append(wait)


def _task(item_id: str) -> Task:
    return Task(item_id, item_id, None, 0)


def _chain(
    client: ScriptedClient, items: Items, lines: Lines, control: BatchControl | None = None
) -> tuple[Chain, Lane, BatchControl, ReachabilityGuard]:
    endpoint = Endpoint(client.base_url, 1, "spec")
    lane = Lane(endpoint, client, Breaker(client.base_url, OutagePolicy(), lambda: None))  # type: ignore[arg-type]
    control = control or BatchControl()
    guard = ReachabilityGuard(1, on_unreachable=lambda detail: None)
    spec = BatchSpec(Path("in.jsonl"), Path("out.jsonl"), "m", SamplingParams(0.0, 8, 1.0, None))
    made = Chain(lane, items, spec, lines, control, guard)  # type: ignore[arg-type]
    return made, lane, control, guard


def test_answered_items_go_back_to_back_on_the_loop_and_the_run_ends_when_none_waits() -> None:
    loop = FakeLoop()
    client, items, lines = ScriptedClient(loop), Items("b", "c", "d"), Lines()
    chain, _, _, guard = _chain(client, items, lines)
    assert chain.run(_task("a")) is None
    assert client.sent == ["a", "b", "c", "d"]
    assert [line["id"] for line in lines.lines] == ["a", "b", "c", "d"] == items.left
    assert all(line["ok"] and line["attempts"] == 1 for line in lines.lines)
    assert lines.waits == [False] * 4, "the loop must never wait for the journal"
    assert client.threads == {threading.current_thread().name, loop.thread.name}
    assert guard.answered


def test_a_failed_attempt_hands_its_item_to_the_thread_and_takes_no_more() -> None:
    refused = RequestError(ErrorInfo("overloaded", "429 too many requests"))
    client = ScriptedClient(FakeLoop(), {"b": refused})
    items, lines = Items("b", "c"), Lines()
    chain, *_ = _chain(client, items, lines)
    handoff = chain.run(_task("a"))
    assert handoff is not None and handoff.task.id == "b"
    assert handoff.first.failure is refused
    with pytest.raises(RequestError):
        handoff.first.result()
    assert [line["id"] for line in lines.lines] == ["a"] and items.left == ["a"]
    assert [t.id for t in items.waiting] == ["c"], "the next item stays for whoever is free"


@pytest.mark.parametrize("why", ["stop", "breaker", "backlog"])
def test_the_run_ends_after_the_item_in_flight_when_the_thread_is_needed(why: str) -> None:
    client, items = ScriptedClient(FakeLoop()), Items("b", "c")
    lines = Lines(backlog_after=1 if why == "backlog" else None)
    chain, lane, control, _ = _chain(client, items, lines)
    if why == "stop":
        control.fail("interrupted", "")
    elif why == "breaker":
        lane.breaker.trip("test")
    assert chain.run(_task("a")) is None
    assert [line["id"] for line in lines.lines] == ["a"], "the item in flight is recorded"
    assert [t.id for t in items.waiting] == ["b", "c"]


def test_a_recording_that_fails_is_handed_to_the_thread_as_the_items_failure() -> None:
    class BrokenLines(Lines):
        def record(self, *args: Any, **kw: Any) -> None:
            raise UnicodeEncodeError("utf-8", "x", 0, 1, "surrogates not allowed")

    client = ScriptedClient(FakeLoop())
    chain, *_ = _chain(client, Items("b"), BrokenLines())
    handoff = chain.run(_task("a"))
    assert handoff is not None and handoff.task.id == "a"
    assert isinstance(handoff.first.failure, UnicodeEncodeError)


def test_a_stuck_loop_hands_the_item_over_as_a_timeout_and_its_late_answer_is_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chain_module, "GRACE_S", 0.1)
    client, lines = ScriptedClient(FakeLoop(), {"a": "never"}), Lines()
    chain, *_ = _chain(client, Items("b"), lines)
    handoff = chain.run(_task("a"))
    assert handoff is not None and handoff.task.id == "a"
    assert isinstance(handoff.first.failure, RequestError)
    assert handoff.first.failure.info.kind == "timeout"
    assert "the I/O loop is stuck" in handoff.first.failure.info.message
    client.stuck[0](ANSWER, None)  # the answer after all: the thread has the item now
    assert lines.lines == [] and client.sent == ["a"]

"""The closed loop and the wave over the asyncio transport (calibrate/load/closed_loop.py,
wave_loop.py): C in flight, no thread per slot or request, and nothing but I/O on the loop: one
helper parses, builds and sends.

A scripted client answers on a fake loop thread; the real client against the mock is
tests/test_request_times.py's closed-loop test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

from calibrate.errors import ErrorInfo, RequestError
from calibrate.http.models import Choice, Completion, ContextLimit, Usage
from calibrate.load.closed_loop import HELPER
from calibrate.load.request import Request
from calibrate.load.wave_loop import HELPER as WAVE_HELPER
from calibrate.load.waves import Sender
from calibrate.load.window import LevelWindow

Done = Callable[[Completion | None, BaseException | None], None]
LOOP = "fake-io-loop"


class LoopClient:
    """Submits to one fake loop thread, which answers (after ``answer_s``) once the first
    ``gate`` requests are all in flight; ``script`` maps a request's number to its failure
    or its completion. Counts the most requests ever in flight, and who sent each."""

    can_submit = True
    timeout_s = 30.0
    base_url = "http://scripted.invalid/v1"

    def __init__(self, gate: int, answer_s: float = 0.002, script: dict[int, Any] | None = None):
        self.jobs: SimpleQueue[Callable[[], None]] = SimpleQueue()
        self.opened = threading.Event()
        self.gate, self.answer_s, self.script = gate, answer_s, script or {}
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.senders: list[str] = []
        self.parsed_on: list[str] = []
        threading.Thread(target=self._loop, name=LOOP, daemon=True).start()

    def _loop(self) -> None:
        self.opened.wait(5)
        while True:
            job = self.jobs.get()
            time.sleep(self.answer_s)
            job()

    def submit_completion(
        self, path: str, body: dict[str, Any], done: Done, off_loop: Any = None
    ) -> float:
        number = body["n"]
        parsed_on: list[str] = self.parsed_on
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.senders.append(threading.current_thread().name)
            if len(self.senders) >= self.gate:
                self.opened.set()
        outcome = self.script.get(number, _answer())

        def parse() -> None:  # where the client parses: the loop, or what off_loop runs
            parsed_on.append(threading.current_thread().name)
            if isinstance(outcome, BaseException):
                done(None, outcome)
            else:
                done(outcome, None)

        def answer() -> None:
            with self.lock:
                self.in_flight -= 1
            if off_loop is None:
                parse()
            else:
                off_loop(parse)

        self.jobs.put(answer)
        return 0.0


def _answer(finish: str = "stop", tokens: int = 5) -> Completion:
    return Completion((Choice(0, "答案。", finish),), Usage(3, tokens, 3 + tokens), "m", None, 0.01)


def _supply(forced: int | None = None) -> tuple[Callable[[], Request], list[str]]:
    numbers = iter(range(1, 10_000))
    built_on: list[str] = []

    def supply() -> Request:
        built_on.append(threading.current_thread().name)
        n = next(numbers)
        return Request("/chat/completions", {"n": n, "model": "m"}, ("p",), n, forced_tokens=forced)

    return supply, built_on


def test_c_stay_in_flight_and_one_helper_not_a_thread_per_slot_sends_the_rest() -> None:
    client = LoopClient(gate=4)
    supply, built_on = _supply()
    run = Sender(client).closed_loop(supply, 4, LevelWindow(0.05, 16))  # type: ignore[arg-type]
    assert client.most == 4, "C in flight, never more"
    assert len(run.items) == len(client.senders) >= 16 and all(i.ok for i in run.items)
    assert [i.index for i in run.items] == list(range(1, len(run.items) + 1))
    assert run.full_s is not None and run.stop_s is not None and run.stop_s >= 0.05
    assert max(i.started_s for i in run.items) < run.stop_s
    # the caller starts the first C, the helper every later one: no thread per slot; and
    # nothing but I/O on the loop (a parse there would hold up every other stream's stamps)
    assert client.senders[:4] == [threading.current_thread().name] * 4
    assert set(client.senders[4:]) == {HELPER}
    assert LOOP not in built_on, "requests are never built on the I/O loop"
    assert set(client.parsed_on) == {HELPER}, "answers are never parsed on the I/O loop"


def test_a_failed_answer_ends_the_run_without_waiting_for_the_window() -> None:
    refused = RequestError(ErrorInfo("overloaded", "429 too many requests"))
    client = LoopClient(gate=4, script={6: refused})
    supply, _ = _supply()
    began = time.monotonic()
    run = Sender(client).closed_loop(supply, 4, LevelWindow(20.0, 16))  # type: ignore[arg-type]
    assert time.monotonic() - began < 10, "the window of 20 s was waited out after a failure"
    failed = [i for i in run.items if not i.ok]
    assert [i.index for i in failed] == [6] and failed[0].error is not None
    assert failed[0].error.kind == "overloaded"
    assert len(client.senders) <= 6 + 3, "after the failure only those in flight may finish"
    assert len(run.items) == len(client.senders), "every request sent is recorded"
    assert run.stop_s is not None


def test_a_cut_answer_reads_the_servers_context_off_the_loop() -> None:
    read_on: list[str] = []

    class Reading(Sender):
        def server_context(self, model: str) -> ContextLimit | None:
            read_on.append(threading.current_thread().name)
            return None  # the server says nothing: the cut is named without numbers

    client = LoopClient(gate=2, script={3: _answer("length", tokens=2)})
    supply, _ = _supply(forced=5)
    sender = Reading(client)  # type: ignore[arg-type]
    good = {n: _answer("length", tokens=5) for n in range(1, 100) if n != 3}
    client.script = {**good, **client.script}
    run = sender.closed_loop(supply, 2, LevelWindow(20.0, 8))
    cut = [i for i in run.items if not i.ok]
    assert [i.index for i in cut] == [3] and cut[0].error is not None
    assert cut[0].error.kind == "incomplete"
    assert read_on == [HELPER], "the context is read over HTTP: never on the loop"


def _wave(count: int) -> list[Request]:
    return [
        Request("/chat/completions", {"n": n, "model": "m"}, ("p",), n) for n in range(1, count + 1)
    ]


def test_a_wave_keeps_workers_in_flight_and_one_helper_sends_the_rest() -> None:
    client = LoopClient(gate=3)
    answered, wall_s = Sender(client).send(_wave(10), 3)  # type: ignore[arg-type]
    assert client.most == 3, "at most workers in flight"
    assert [i.index for i in answered] == list(range(1, 11)) and all(i.ok for i in answered)
    assert wall_s >= max(i.started_s for i in answered)
    # the caller sends the first three, the helper the rest: no thread per request
    assert client.senders[:3] == [threading.current_thread().name] * 3
    assert set(client.senders[3:]) == {WAVE_HELPER}
    assert set(client.parsed_on) == {WAVE_HELPER}, "answers are never parsed on the I/O loop"


def test_a_failure_in_a_wave_is_kept_and_the_wave_goes_on() -> None:
    """The ladder never retries and never cuts a wave short: a failure is information."""
    refused = RequestError(ErrorInfo("overloaded", "429 too many requests"))
    client = LoopClient(gate=4, script={2: refused, 5: refused})
    answered, _ = Sender(client).send(_wave(8), 4)  # type: ignore[arg-type]
    assert [i.index for i in answered] == list(range(1, 9)), "every request is recorded"
    failed = [i for i in answered if not i.ok]
    assert [i.index for i in failed] == [2, 5]
    assert all(i.error is not None and i.error.kind == "overloaded" for i in failed)
    assert len(client.senders) == 8


def test_a_request_that_cannot_be_sent_is_its_own_failure_not_a_stuck_wave() -> None:
    class Refusing(LoopClient):
        def submit_completion(
            self, path: str, body: dict[str, Any], done: Done, off_loop: Any = None
        ) -> float:
            if body["n"] == 3:
                raise RequestError(ErrorInfo("connection", "connection refused"))
            return super().submit_completion(path, body, done, off_loop)

    client = Refusing(gate=1)
    began = time.monotonic()
    answered, _ = Sender(client).send(_wave(5), 5)  # type: ignore[arg-type]
    assert time.monotonic() - began < 10, "the wave waited for a request never sent"
    assert [i.index for i in answered] == [1, 2, 3, 4, 5]
    assert [i.index for i in answered if not i.ok] == [3]

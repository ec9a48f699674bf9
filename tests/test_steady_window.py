"""A closed loop's throughput counts each answer once, whatever order calibrate handles them in.

A server that runs C requests together ends them together. calibrate handles those answers one
after another; the first handled once the window is done is not replaced, and the steady window
used to close when calibrate decided that, on its own clock, after the rest of the burst had
finished: up to C − 1 answers counted too many. In a short window (tune's, or a sweep's small
levels) that read 9.6 items/s at concurrency 2 on a server that can do 8.2.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from dataclasses import replace

import pytest

from calibrate.http.models import SamplingParams, chat_request
from calibrate.http.request_times import RequestTimes
from calibrate.load.engine import DONE, SEND, WAIT, Drive, Record
from calibrate.load.items import ItemResult
from calibrate.load.pacing import Closed
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.load.sim.clock import VirtualClock
from calibrate.load.sim.server import SimServer
from calibrate.load.window import LevelWindow, LoopRun, steady_throughput
from calibrate.mock import MockSettings

PARAMS = SamplingParams(temperature=0.0, max_tokens=512, top_p=1.0, seed=0)


def _supply() -> Callable[[], Request]:
    numbers = itertools.count(1)

    def supply() -> Request:  # one prompt: every answer is as long, so a burst ends together
        body = chat_request("internlm-s2", "the same item", PARAMS)
        return Request("/chat/completions", body, ("the same item",), next(numbers))

    return supply


@pytest.mark.parametrize("concurrency", [2, 4])
def test_a_closed_loop_is_never_faster_than_a_server_that_ends_its_batch_together(
    concurrency: int,
) -> None:
    # C slots, a fixed ≈ 0.1 s per request: the server's most is C / 0.1 s, and every burst of
    # C answers ends at one moment (the simulated server: exactly)
    clock = VirtualClock()
    server = SimServer(MockSettings(slots=concurrency, ttft_s=0.02, per_token_s=0.002), clock)
    sender = Sender(server, clock)
    for _ in range(3):
        run = sender.closed_loop(_supply(), concurrency, LevelWindow(0.0, 4 * concurrency))
        latency_s = statistics.median(i.elapsed_s for i in run.items if i.ok)
        steady = steady_throughput(run)
        assert not steady.whole_run
        ceiling = concurrency / latency_s
        assert steady.items_per_s <= ceiling * 1.0001, (
            f"{steady.items_per_s:.2f} items/s from {steady.completions} answers in "
            f"{steady.window_s:.3f} s; the server can do {ceiling:.2f}"
        )


def _answer(index: int, finished_s: float) -> ItemResult:
    return ItemResult(
        index, "p", "/chat/completions", {}, "a", "stop", None, 1, 0.1, None, 0.0, finished_s
    )


def test_the_window_closes_at_the_first_answer_to_finish_that_was_not_replaced() -> None:
    # bursts of 4 answers at 0.1 s intervals; calibrate decided to drain while handling the
    # burst at 0.5 s (at 0.5004 s, after all four had finished): only the first of them counts
    bursts = [0.1, 0.2, 0.3, 0.4, 0.5]
    items = tuple(
        _answer(4 * b + k + 1, t + k * 0.0001) for b, t in enumerate(bursts) for k in range(4)
    )
    run = LoopRun(items, 0.6, full_s=0.0, stop_s=0.5004)
    assert steady_throughput(run).completions == 3 + 4 * 3 + 4, "what the decision's clock counts"
    closed = run.closed_by(items[-4:])  # the last burst: none of its answers was replaced
    steady = steady_throughput(closed)
    assert closed.closed_s == 0.5
    assert steady.completions == 3 + 4 * 3 + 1
    assert steady.items_per_s == pytest.approx(4 / 0.1, rel=1e-3)
    # a run that never began its drain (a stuck request) keeps its own end
    assert LoopRun(items, 0.6, 0.0, None).closed_by(items[-4:]).closed_s is None


def _told(number: int, sent_s: float, finished_s: float) -> Record:
    times = RequestTimes.of(START + sent_s, START + finished_s)
    item = replace(_answer(number, finished_s), started_s=sent_s, times=times)
    request = Request("/chat/completions", {}, ("p",), number)
    return Record(number, request, (item,), sent_s, finished_s)


START = 100.0  # the run's start on the requests' clock


def test_the_closed_policy_closes_its_window_at_the_first_answer_it_did_not_replace() -> None:
    """C = 2 whose window is done once 4 have started: the burst that ends at 0.2 s is handled
    at 0.25 s and 0.26 s (calibrate was busy); neither is replaced, the drain began at 0.25 s,
    and the window closes at 0.2 s, when the first of them finished."""
    closed = Closed(2, LevelWindow(0.0, 4))
    assert [closed.next(0.0, n) for n in (0, 1, 2)] == [SEND, SEND, WAIT]
    for number, (told_s, in_flight) in enumerate(((0.1, 1), (0.1, 1)), start=1):
        closed.answered(_told(number, 0.0, 0.1), told_s)
        assert closed.next(told_s, in_flight) == SEND  # replaced: 3 and 4 start
    records = [_told(1, 0.0, 0.1), _told(2, 0.0, 0.1), _told(3, 0.1, 0.2), _told(4, 0.1, 0.2)]
    for record, told_s in ((records[2], 0.25), (records[3], 0.26)):
        closed.answered(record, told_s)
        assert closed.next(told_s, 1) == DONE
    run = closed.result(Drive(tuple(records), START, 0.26))
    assert (run.full_s, run.stop_s, run.closed_s) == (0.0, 0.25, 0.2)
    assert [i.index for i in closed.unreplaced] == [3, 4]

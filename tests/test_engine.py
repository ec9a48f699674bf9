"""The one load engine (calibrate/load/engine.py) under its pacing policies, on a virtual clock:
a wave keeps its workers in flight and never stops on a failure, a closed loop keeps C in
flight until its window or a failure, an open loop keeps its schedule and its cap, a request
that cannot be sent or is never answered is a recorded failure — all in milliseconds.

The transport here is scripted (a fake behind the engine's Transport protocol, as httpx's
MockTransport); the simulated server is tests/stages/sweep/test_fast.py's, the real one over
HTTP tests/test_request_times.py's."""

from __future__ import annotations

import gc
import os

from calibrate.load.engine import GRACE_S
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.load.sim.clock import VirtualClock
from calibrate.load.window import LevelWindow
from tests.stage_fakes import REFUSED, Scripted


def _requests(count: int) -> list[Request]:
    return [Request("/chat/completions", {"model": "m"}, ("p",), n) for n in range(1, count + 1)]


def _sender(transport: Scripted) -> tuple[Sender, VirtualClock]:
    clock = VirtualClock()
    return Sender(transport, clock), clock


def test_a_wave_keeps_its_workers_in_flight_and_answers_every_request() -> None:
    transport = Scripted()
    answered, wall_s = _sender(transport)[0].send(_requests(10), 3)
    assert transport.most == 3, "at most workers in flight"
    assert [i.index for i in answered] == list(range(1, 11)) and all(i.ok for i in answered)
    assert round(wall_s, 6) == 0.04, "four rounds of 10 ms: 3, 3, 3, 1"


def test_a_failure_in_a_wave_is_kept_and_the_wave_goes_on() -> None:
    """The ladder never retries and never cuts a wave short: a failure is information."""
    transport = Scripted(script={2: REFUSED, 5: REFUSED})
    answered, _ = _sender(transport)[0].send(_requests(8), 4)
    assert [i.index for i in answered] == list(range(1, 9)), "every request is recorded"
    failed = [i for i in answered if not i.ok]
    assert [i.index for i in failed] == [2, 5]
    assert all(i.error is not None and i.error.kind == "overloaded" for i in failed)
    assert len(transport.sent) == 8


def test_a_closed_loop_keeps_c_in_flight_until_its_window_then_drains() -> None:
    transport = Scripted()
    requests = iter(_requests(10_000))
    run = _sender(transport)[0].closed_loop(lambda: next(requests), 4, LevelWindow(0.05, 16))
    assert transport.most == 4, "C in flight, never more"
    assert len(run.items) == len(transport.sent) >= 16 and all(i.ok for i in run.items)
    assert [i.index for i in run.items] == list(range(1, len(run.items) + 1))
    assert run.full_s == 0.0 and run.stop_s is not None and run.stop_s >= 0.05
    assert max(i.started_s for i in run.items) < run.stop_s, "nothing starts in the drain"


def test_a_failed_answer_ends_the_closed_loop_without_waiting_for_the_window() -> None:
    transport = Scripted(script={6: REFUSED})
    requests = iter(_requests(10_000))
    sender, clock = _sender(transport)
    run = sender.closed_loop(lambda: next(requests), 4, LevelWindow(20.0, 16))
    assert clock.now() < 1.0, "the window of 20 s was waited out after a failure"
    failed = [i for i in run.items if not i.ok]
    assert [i.index for i in failed] == [6] and failed[0].error is not None
    assert failed[0].error.kind == "overloaded"
    assert len(transport.sent) <= 6 + 3, "after the failure only those in flight may finish"
    assert len(run.items) == len(transport.sent), "every request sent is recorded"
    assert run.stop_s is not None


def test_an_open_loop_keeps_its_schedule_and_its_cap() -> None:
    """Ten sends 10 ms apart against answers of 35 ms, at most 2 in flight: the cap holds the
    third send back until the first answer, and every later one by as much; lag is counted."""
    transport = Scripted(answer_s=0.035)
    schedule = [n * 0.01 for n in range(10)]
    run = _sender(transport)[0].open_loop(_requests(10), schedule, 2)
    assert transport.most == 2 and max(run.in_flight) == 1
    assert len(run.items) == 10 and all(i.ok for i in run.items)
    assert [round(lag, 6) for lag in run.lag_s[:3]] == [0.0, 0.0, 0.015]
    assert run.capped_s > 0 and round(run.last_send_s, 6) >= 0.09
    free = _sender(Scripted(answer_s=0.035))[0].open_loop(_requests(10), schedule, None)
    assert max(free.in_flight) == 3 and max(free.lag_s) < 1e-6, "no cap: on time"


def test_a_failed_answer_stops_an_open_loop_s_sends() -> None:
    transport = Scripted(answer_s=0.005, script={2: REFUSED})
    run = _sender(transport)[0].open_loop(_requests(10), [n * 0.01 for n in range(10)], None)
    assert transport.sent == [1, 2], "the failure came before the third send was due"
    assert [i.index for i in run.items if not i.ok] == [2]


def test_a_request_the_transport_cannot_send_is_its_own_failure() -> None:
    transport = Scripted(script={3: ValueError("a bug of the transport's own")})
    answered, _ = _sender(transport)[0].send(_requests(5), 5)
    assert [i.index for i in answered] == [1, 2, 3, 4, 5]
    failed = [i for i in answered if not i.ok]
    assert [i.index for i in failed] == [3] and failed[0].error is not None
    assert failed[0].error.kind == "internal" and "ValueError" in failed[0].error.message


def test_a_request_never_answered_is_recorded_as_stuck_not_waited_for_forever() -> None:
    transport = Scripted(script={2: None})
    sender, clock = _sender(transport)
    answered, _ = sender.send(_requests(3), 3)
    assert [i.index for i in answered] == [1, 2, 3]
    stuck = [i for i in answered if not i.ok]
    assert [i.index for i in stuck] == [2] and stuck[0].error is not None
    assert stuck[0].error.kind == "timeout"
    assert round(clock.now(), 3) == transport.timeout_s + GRACE_S, "its deadline and a grace"
    assert transport.in_flight == 0, "the stuck request was cancelled, not left running"


def test_a_virtual_clock_that_is_done_with_closes_its_loop() -> None:
    """Each clock's loop holds three descriptors (its epoll and a socket pair). A clock no
    longer referenced closes its loop: a pytest worker that ran the simulated tests held
    over a thousand of them (a clock's loop kept the clock, its finalizer kept the loop)."""
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        _sender(Scripted())[0].send(_requests(4), 2)
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before

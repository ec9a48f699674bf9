"""The server's own account in a batch's drift watch (``drift/server.py``), read from a scripted
/metrics: a restart of the server — its counters starting again from 0 — is a restart, never a
negative or lost count of preemptions, and the window that holds it is left out of the drift
rule even when the batch's breaker never saw an outage (a server back within its retries)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from calibrate.errors import ErrorInfo, RequestError
from calibrate.stages.batch.drift import DriftWatch
from calibrate.stages.batch.drift.server import ServerWatch
from tests.stages.batch.drift_fakes import CAL, FAST, LABEL, SLOW, C


class Server:
    """A vLLM-style /metrics of one process after another: its preemptions and requests since
    it started, or refused while it is down."""

    def __init__(self, preempted: float = 0, requests: float = 0, *, started: bool = False) -> None:
        self.preempted, self.requests, self.started, self.down = preempted, requests, 1e9, False
        self.says_started = started  # prometheus_client's process_start_time_seconds

    def restart(self, down: bool = False) -> None:
        self.preempted = self.requests = 0
        self.started += 60
        self.down = down

    def metrics(self) -> str:
        if self.down:
            raise RequestError(ErrorInfo("connect", "connection refused"))
        return (
            f'vllm:num_preemptions_total{{model_name="m"}} {self.preempted}\n'
            f'vllm:request_success_total{{model_name="m",finished_reason="stop"}} {self.requests}\n'
            'vllm:num_requests_running{model_name="m"} 4\n'
        ) + (f"process_start_time_seconds {self.started}\n" if self.says_started else "")


def test_a_counter_going_backwards_is_a_restart_and_the_preemptions_add_up() -> None:
    """The old process preempted 100 before the batch and 10 during it; the new one has
    preempted 130 by its first reading — past the old reading, so the preemption counter alone
    does not go backwards, but its request counter does: a restart, and the rise is 10 + 130.
    (It read 130 − 100 = 30.)"""
    server = Server(preempted=100, requests=5_000)
    watch = ServerWatch(server.metrics)
    assert watch.read() == "answered"
    server.preempted, server.requests = 110, 5_200
    assert watch.read() == "answered"
    server.restart()
    server.preempted, server.requests = 130, 40
    assert watch.read() == "restarted"
    seen = watch.window()
    assert seen is not None and seen.preemptions == 10 + 130, seen
    server.preempted, server.requests = 135, 80
    assert watch.read() == "answered"
    seen = watch.window()
    assert seen is not None and seen.preemptions == 10 + 135, seen


def test_a_restart_the_batch_made_is_told_and_counts_from_0() -> None:
    """``batch --restart`` restarted the server: told so, its next reading is another process
    even when no counter of it went down (the old one at 3 preemptions, the new one at 7)."""
    server = Server(preempted=3)
    watch = ServerWatch(server.metrics)
    assert watch.read() == "answered"
    server.restart()
    server.preempted, server.requests = 7, 0  # the new process's first reading
    watch.restarted()
    assert watch.read() == "restarted"
    seen = watch.window()
    assert seen is not None and seen.preemptions == 0 + 7, seen


def test_preemptions_are_never_negative_over_any_restarts() -> None:
    """Processes one after another (each with its own start time), each preempting a random
    number, restarts at random: the rise is each process's count summed, never negative, never
    falling."""
    rng = random.Random(11)
    for _ in range(200):
        server = Server(preempted=rng.randrange(0, 10_000), started=True)
        watch = ServerWatch(server.metrics)
        watch.read()
        expected, counted, last = 0.0, server.preempted, 0.0
        for _ in range(rng.randrange(2, 30)):
            if rng.random() < 0.2:
                expected += server.preempted - counted
                server.restart()
                counted = 0
            server.preempted += rng.randrange(0, 5)
            server.requests += rng.randrange(1, 50)
            watch.read()
            seen = watch.window()
            assert seen is not None and seen.preemptions is not None
            assert seen.preemptions >= last >= 0, (seen, last)
            last = seen.preemptions
        assert last == expected + server.preempted - counted


def test_a_scrape_refused_after_the_server_answered_is_down_before_it_says_nothing() -> None:
    server = Server()
    server.down = True
    watch = ServerWatch(server.metrics)
    assert watch.read() == "silent"  # never answered: maybe no /metrics here at all
    server.down = False
    assert watch.read() == "answered"
    server.down = True
    assert watch.read() == "down"
    assert not watch.gone


@pytest.mark.parametrize("started", [False, True])
def test_counters_that_go_up_and_down_in_turn_are_several_processes_not_restarts(
    started: bool,
) -> None:
    """Two engines behind one URL, each scrape answered by either: their counters (and start
    times) go back and forth. A restart is read once, then no more — else every window would be
    left out and drift never judged."""
    a, b = Server(requests=10_000, started=started), Server(requests=50, started=started)
    b.started += 3_600
    turn = [0]
    watch = ServerWatch(lambda: (a if turn[0] % 2 == 0 else b).metrics())
    heard = []
    for scrape in range(20):
        turn[0] = scrape
        a.requests += 10
        b.requests += 10
        heard.append(watch.read())
    assert heard.count("restarted") == 1 and watch.mixed, heard


def _drive(server: Server, restart_at: int, n: int) -> tuple[DriftWatch, list[str]]:
    """A closed loop of C on a virtual clock, slow (3×) from item 140 to the end: the server
    restarted at ``restart_at`` within the batch's retries — the breaker never opens, only the
    server's /metrics say it: down for a second, then another process."""
    now, warnings = [0.0], []
    watch = DriftWatch(
        CAL,
        label=LABEL,
        concurrency=C,
        slots=C,
        cap=C,
        to_run=n,
        replay="out.jsonl",
        warn=warnings.append,
        write=lambda row: None,
        server=ServerWatch(server.metrics),
        clock=lambda: now[0],
        cores=2,
    )
    rng, next_tick, back_at = random.Random(5), 1.0, None
    for i in range(n):
        took = (SLOW if i >= 140 else FAST) * rng.uniform(0.9, 1.1)
        if i == restart_at:
            server.restart(down=True)
            back_at = now[0] + 1.0
            took += 1.0  # the item in flight waited for the new process
        now[0] += took / C
        if back_at is not None and now[0] >= back_at:
            server.down, back_at = False, None
        server.requests += 1
        line: dict[str, Any] = {"id": f"t{i}", "ok": True, "seconds": took}
        line["usage"] = {"prompt_tokens": 24, "completion_tokens": 30}
        watch.seen(line, 30, LABEL)
        while now[0] >= next_tick:
            watch.tick()
            next_tick += 1.0
    watch.stop()
    return watch, warnings


def test_a_restart_seen_only_in_the_servers_metrics_ends_a_run_of_windows() -> None:
    """The server slows at item 140 and is restarted (another process, as slow) at item 185,
    back within the batch's retries: no outage event, only its /metrics say it (refused for a
    second, then counters from 0). The windows that held the downtime and the restart are left
    out, and no run of windows spans them: no drift from three windows of two processes. (It
    warned "drift: … from item 148 on (3 windows in a row …)": a window of the old process,
    the one that held the restart, and one of the new.)"""
    watch, warnings = _drive(Server(requests=1_000), restart_at=185, n=240)
    left = [w for w in watch.windows if w.left_out]
    assert left and {w.left_out for w in left} <= {"outage", "restart"}, watch.windows
    assert "restart" in {w.left_out for w in left}
    assert warnings == [], warnings
    record = watch.record()
    assert not record.drifted and "that held a restart of the server" in record.line(), record

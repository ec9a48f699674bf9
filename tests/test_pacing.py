"""The open loop's pacing (``load.pacer``): how late each send went out is measured, kept per
request and per level, and reported — no timing thresholds here (the figures are
``bench/pacing.py``'s), only that the lag is there, non-negative and summed up right."""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.http.models import Choice, Completion, Usage
from calibrate.load.answers import answer_items
from calibrate.load.items import ItemResult
from calibrate.load.open_loop import OpenRun, judge, open_loop
from calibrate.load.pacer import SenderPool, SendLag, fine_switching, wait_until
from calibrate.load.request import Request
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, open_gate


def _item(n: int) -> ItemResult:
    request = Request("/chat/completions", {}, ("p",), n + 1)
    completion = Completion((Choice(0, "t", "stop"),), Usage(1, 5, 6), "m", None, 0.001)
    return answer_items(request, completion, 0.0, 0.001, None)[0]


def test_send_lag_figures_of_a_run_and_the_worst_of_a_levels_runs() -> None:
    lags = [0.0001] * 97 + [0.002, 0.003, 0.010]
    lag = SendLag.of(lags)
    assert lag is not None
    assert (lag.p50_s, lag.p99_s, lag.max_s, lag.late, lag.sends) == (0.0001, 0.003, 0.01, 3, 100)
    assert SendLag.of([]) is None
    calm = SendLag.of([0.0002] * 10)
    level = SendLag.worst([lag, None, calm])
    assert level == SendLag(0.0002, 0.003, 0.01, 3, 110)
    assert level.to_json() == {
        "send_lag_p50_s": 0.0002,
        "send_lag_p99_s": 0.003,
        "send_lag_max_s": 0.01,
        "late_sends": 3,
    }


def test_a_judged_run_carries_its_send_lag_and_inf_carries_none() -> None:
    items = tuple(replace(_item(n), started_s=0.1 * n, done_s=0.1 * n + 0.01) for n in range(10))
    run = OpenRun(items, 1.0, 0.9, (0,) * 10, 0.0, (0.0,) * 9 + (0.004,))
    lag = judge(run, 10.0, None).send_lag
    assert lag is not None and lag.max_s == 0.004 and lag.late == 1
    assert judge(run, 10.0, None).send_lag_p99_s == 0.004
    assert judge(run, None, None).send_lag is None


def test_wait_until_sleeps_to_just_before_the_slot_and_a_still_clock_cannot_hold_it() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    wait_until(1.0, lambda: now[0], sleep, spin_s=0.001)
    assert slept == [pytest.approx(0.999)], "the last millisecond is spun, not slept"
    wait_until(0.5, lambda: now[0], sleep)  # a slot already past: no sleep at all
    assert len(slept) == 1


def test_fine_switching_is_restored_after_the_run() -> None:
    before = sys.getswitchinterval()
    with fine_switching(0.0001) as fine:
        assert sys.getswitchinterval() == pytest.approx(0.0001)
        fine(False)
        assert sys.getswitchinterval() == before
        fine(True)
    assert sys.getswitchinterval() == before


def test_a_request_handed_while_every_pool_thread_is_busy_gets_a_thread_of_its_own() -> None:
    release, seen = threading.Event(), []
    lock = threading.Lock()

    def work(n: int) -> None:
        with lock:
            seen.append(n)
        release.wait(5)

    assert SenderPool(work, 0).spin_s == 0.0, "no sender waits: the pacer does not spin"
    pool = SenderPool(work, 1)
    for n in range(4):
        pool.hand(n)  # each blocks until released: four in flight need four threads
    assert len(pool.threads) == 4, "one from the pool, three of their own"
    release.set()
    pool.close(5)
    assert sorted(seen) == [0, 1, 2, 3]
    again = SenderPool(work, 2)
    for n in range(10, 16):
        again.hand(n)  # nothing blocks now: the two pool threads take most of them
    again.close(5)
    assert sorted(n for n in seen if n >= 10) == list(range(10, 16))


def test_every_sent_request_carries_how_late_it_went_out() -> None:
    run = open_loop(lambda n, t0: [_item(n)], [0.002 * n for n in range(20)], None, join_s=5)
    assert len(run.lag_s) == 20 and all(lag >= 0 for lag in run.lag_s)
    assert [i.send_lag_s for i in run.items] == list(run.lag_s)


def test_a_rate_level_reports_its_send_lag_in_json_rounds_and_records(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0) as mock:
        open_gate(isolated, mock.base_url, FAST + "[sweep]\nlevel_s = 0.5\nrepeats = 1\n", "ladder")
        result = cli("sweep", "--rates", "20", "--arrival", "constant", "--json")
    assert result.code == 0, result.err
    (level,) = result.json["levels_detail"]
    for key in ("send_lag_p50_s", "send_lag_p99_s", "send_lag_max_s"):
        assert level[key] >= 0, key
    assert level["send_lag_p50_s"] <= level["send_lag_p99_s"] <= level["send_lag_max_s"]
    assert 0 <= level["late_sends"] <= level["items"]
    folder = isolated / "runs" / result.json["run_id"]
    (round_line,) = [
        json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()
    ]
    assert round_line["send_lag_max_s"] == level["send_lag_max_s"]
    records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    rated = [r for r in records if r.get("offered_rate") == 20.0]
    assert len(rated) == level["items"] >= 8
    assert all(r["send_lag_s"] >= 0 for r in rated)
    assert max(r["send_lag_s"] for r in rated) == level["send_lag_max_s"]

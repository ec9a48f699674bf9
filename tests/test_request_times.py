"""Every request record says when it was sent, first answered and finished (SPEC §4.1): on the
one monotonic clock, so the timeline and the sweep's steady window show what happened."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams, Usage
from calibrate.http.request_times import RequestTimes
from calibrate.load.items import ItemResult
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.load.window import LevelWindow, LoopRun, steady_throughput
from tests.mockserver import start_mock
from tests.report_helpers import Page
from tests.tier_helpers import FAST, jsonl, open_gate, run_dir

# 4 slots, 8 in flight: a request takes ≈ 0.02 + 40 × 0.002 = 0.1 s, the second four wait for it
QUEUED_MOCK: dict[str, Any] = {"ttft_s": 0.02, "per_token_s": 0.002, "slots": 4}
WAVE_OF_8 = FAST + "batch_sizes = [8]\nrounds = 1\n"


def _times(record: dict[str, Any]) -> tuple[float, float | None, float]:
    return record["sent_at"], record["first_token_at"], record["finished_at"]


def _ladder_of_8(cli: Any, isolated: Path) -> Path:
    """One tier of 8 on 4 slots. The server's running gauge holds at 4 while the rest wait, so
    the tier is ``stop: cap`` and no tier is kept (exit 1): its records are written all the same.
    The queue lasts one answer (0.1 s): a machine at load 15 once sampled the gauge too seldom
    to see it, and the tier passed (exit 0) — its records are the subject here, not the cap."""
    with start_mock(**QUEUED_MOCK) as mock:
        open_gate(isolated, mock.base_url, WAVE_OF_8)
        ladder = cli("ladder", "--json")
    verdict = ladder.json["tiers"][0]["verdict"]
    assert (ladder.code, verdict) in ((1, "stop: cap"), (0, "pass")), ladder.err
    return run_dir(isolated, ladder.json["run_id"])


def test_a_ladder_wave_records_when_each_request_was_sent_answered_and_finished(
    cli, isolated: Path
) -> None:
    before = time.time()
    records = jsonl(_ladder_of_8(cli, isolated) / "records.jsonl")
    after = time.time()
    assert len(records) == 8
    for record in records:
        sent, first, finished = _times(record)
        assert first is not None, "the ladder streams: the first token has a time"
        assert before <= sent <= first <= finished <= after
        assert abs((finished - sent) - record["elapsed_s"]) < 0.002
        assert round(finished, 6) == finished  # microseconds, no more
        assert isinstance(record["ts"], str) and record["ts"].endswith("Z")  # written at
    sends = sorted(r["sent_at"] for r in records)
    assert sends[-1] - sends[0] < 0.09, "a wave is sent together"
    finishes = sorted(r["finished_at"] for r in records)
    assert len(set(finishes)) == 8, "each request has its own finish"
    # the second four waited for a slot: none can finish before a slot freed (one service time
    # after the first send, at the least) and its own service after that — whenever a busy
    # machine lets the client read the answers (it read the first four 0.34 s apart once)
    tokens = min(r["usage"]["completion_tokens"] for r in records)
    service_s = QUEUED_MOCK["ttft_s"] + QUEUED_MOCK["per_token_s"] * tokens
    assert finishes[4] - sends[0] >= 2 * service_s, (service_s, sends[0], finishes)
    firsts = sorted(r["first_token_at"] for r in records)
    assert firsts[4] - sends[0] >= service_s + QUEUED_MOCK["ttft_s"], "the queued four came later"


def test_the_html_timeline_draws_the_recorded_times_queued_requests_end_later(
    cli, isolated: Path
) -> None:
    """Each bar spans its request's recorded send and finish, on one scale: its ends stand
    where the records' finishes do, so the second four (queued for a slot: the test above)
    end later on the page by just as much as they did in the records."""
    run = _ladder_of_8(cli, isolated)
    result = cli("report", str(run), "--html", "--timeline", "8", "--json", "--no-plot")
    assert result.code == 0, result.err
    assert result.json["timeline"]["times"] == "recorded"
    page = Page((run / "report.html").read_text("utf-8"))
    assert "sent and finished as recorded" in page.id_text["timeline-source"]
    bars = [a for t, a in page.tags if t == "rect" and "bar" in a.get("class", "")]
    ends = sorted(float(b["x"]) + float(b["width"]) for b in bars)
    assert len(ends) == 8 and page.count("line", "ttft") == 8
    starts = sorted(float(b["x"]) for b in bars)
    records = jsonl(run / "records.jsonl")
    sent = sorted(r["sent_at"] for r in records)
    finished = sorted(r["finished_at"] for r in records)
    # the page's scale: from the first send to the last finish, in the records and in pixels
    span_s, span_px = finished[-1] - sent[0], ends[-1] - starts[0]
    drawn = [(end - starts[0]) / span_px for end in ends]
    recorded = [(f - sent[0]) / span_s for f in finished]
    assert drawn == pytest.approx(recorded, abs=0.01), (drawn, recorded)
    assert [(x - starts[0]) / span_px for x in starts] == pytest.approx(
        [(t - sent[0]) / span_s for t in sent], abs=0.01
    )
    assert drawn[4] - drawn[3] == pytest.approx(recorded[4] - recorded[3], abs=0.01)


def test_single_and_its_failures_carry_the_times_too(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0002) as mock:
        open_gate(isolated, mock.base_url)
        ok = cli("single", "--json")
        streamed = cli("single", "--stream", "--json")
    with start_mock(fail_rate=1.0) as mock:
        open_gate(isolated, mock.base_url)
        failed = cli("single", "--json")
    assert ok.code == 0 and streamed.code == 0 and failed.code == 1
    by_run = {
        name: jsonl(run_dir(isolated, r.json["run_id"]) / "records.jsonl")[0]
        for name, r in (("ok", ok), ("streamed", streamed), ("failed", failed))
    }
    plain, stream, fail = by_run["ok"], by_run["streamed"], by_run["failed"]
    assert plain["first_token_at"] is None, "not streamed: no first token time"
    assert plain["sent_at"] < plain["finished_at"]
    assert stream["sent_at"] < stream["first_token_at"] <= stream["finished_at"]
    assert fail["ok"] is False and fail["sent_at"] <= fail["finished_at"]
    assert abs(fail["finished_at"] - fail["sent_at"] - fail["elapsed_s"]) < 0.002
    assert plain["sent_at"] < stream["sent_at"] < fail["sent_at"], "one clock, in order"


def test_repro_ignores_when_a_request_was_sent(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0002) as mock:
        open_gate(isolated, mock.base_url)
        assert cli("single").code == 0
        repro = cli("repro", "--runs", "2", "--json")
    assert repro.code == 0, repro.err


def test_the_closed_loop_on_the_real_clock_puts_its_window_on_the_recorded_finishes() -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.001, slots=2) as mock:
        client = OpenAIClient(mock.base_url)
        numbers = itertools.count(1)

        def supply() -> Request:
            body = {"model": "internlm-s2", "messages": [{"role": "user", "content": "hi"}]}
            return Request("/chat/completions", body, ("hi",), next(numbers))

        run = Sender.over(client).closed_loop(supply, 4, LevelWindow(0.3, 16))
        client.close()
    assert run.started_at is not None and all(i.times is not None for i in run.items)
    for item in run.items:
        # one clock: the answer's last byte arrived (its recorded finish), then its sender
        # thread took it up (the I/O loop's hand-off: well under 50 ms even on a loaded box)
        assert -0.002 < item.done_s - run.finished_s(item) < 0.05
    steady = steady_throughput(run)
    assert not steady.whole_run and steady.completions >= 8


def _item(n: int, finished_s: float, done_s: float) -> ItemResult:
    return ItemResult(
        index=n,
        prompt="p",
        path="/chat/completions",
        body={},
        text="答案。",
        finish_reason="stop",
        usage=Usage(3, 5, 8),
        completion_tokens=5,
        elapsed_s=0.1,
        ttft_s=None,
        started_s=0.0,
        done_s=done_s,
        times=RequestTimes(1000.0 + finished_s - 0.1, 1000.0 + finished_s),
    )


def test_the_steady_window_counts_the_answers_by_their_recorded_finish() -> None:
    # the loop's own done_s would put every answer at 0 (outside the window): the recorded
    # finishes place four after the window opened, one of them after the drain began
    items = tuple(_item(n, f, 0.0) for n, f in enumerate((1.0, 1.5, 2.0, 2.5, 3.5), 1))
    run = LoopRun(items, 4.0, full_s=0.5, stop_s=3.0, started_at=1000.0)
    steady = steady_throughput(run)
    assert not steady.whole_run
    assert steady.completions == 3 and abs(steady.window_s - 2.0) < 1e-9  # (1.0, 3.0]
    assert [i.index for i in steady.inside] == [2, 3, 4]
    # a run on another clock (a fake one) keeps its own times
    assert steady_throughput(LoopRun(items, 4.0, 0.5, 3.0)).whole_run


def test_a_completion_is_stamped_by_the_client() -> None:
    with start_mock(ttft_s=0.01, per_token_s=0.001) as mock:
        client = OpenAIClient(mock.base_url)
        params = SamplingParams(temperature=0.0, max_tokens=32, top_p=1.0, seed=0)
        body = client.chat_body("internlm-s2", "hi", params, stream=True)
        answer = client.post_completion("/chat/completions", body)
        client.close()
    assert answer.times is not None and answer.ttft_s is not None
    assert answer.times.first_token_at == answer.times.sent_at + answer.ttft_s
    assert abs(answer.times.elapsed_s - answer.elapsed_s) < 1e-6


def test_sweep_records_carry_the_times_and_its_timeline_draws_them(cli, isolated: Path) -> None:
    sweep = "[sweep]\nconcurrency = [1, 4]\nlevel_s = 0.2\nrepeats = 1\n"
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=4) as mock:
        open_gate(isolated, mock.base_url, FAST + sweep, stage="ladder")
        result = cli("sweep", "--json")
    assert result.code in (0, 1), result.err  # the knee may be inconclusive on a fast mock
    run = run_dir(isolated, result.json["run_id"])
    records = jsonl(run / "records.jsonl")
    assert records and all(r["sent_at"] <= r["finished_at"] for r in records)
    four = [r for r in records if r["concurrency"] == 4]
    # a closed loop: requests follow each other, so their sends spread over the level
    sends = sorted(r["sent_at"] for r in four)
    assert sends[-1] - sends[0] > 0.1
    report = cli("report", str(run), "--timeline", "4", "--json", "--no-plot")
    assert report.code == 0, report.err
    assert report.json["timeline"]["times"] == "recorded"

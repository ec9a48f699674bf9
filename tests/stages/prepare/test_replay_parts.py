"""The replay's pure parts, in milliseconds: reading a journal, the order items are sent in, the
job's arrival pattern at another rate, and the tolerance that says a replay is close."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.errors import InputError
from calibrate.io.journal import replay as journal_replay
from calibrate.io.journal.replay import read_job_trace
from calibrate.load.arrivals import arrival_times
from calibrate.report.replay import TokenFit
from calibrate.stages.prepare.replay import ReplayItems, percentiles, spread_order
from calibrate.workload import JobTrace


def _line(n: int, *, ok: bool = True, sent: float | None = None) -> str:
    line: dict[str, object] = {"id": n, "ok": ok, "attempts": 1}
    if ok:
        line["usage"] = {"prompt_tokens": 10 + n, "completion_tokens": n % 5}
    if sent is not None:
        line["sent_at"] = sent
    return json.dumps(line) + "\n"


def test_a_journal_gives_each_finished_items_counts_and_send_times(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    text = "".join(_line(n, sent=1000.0 + n / 10) for n in range(6)) + _line(9, ok=False)
    path.write_text(text + '{"id": 7, "ok": tr')  # a torn last line: a kill -9 mid-write
    trace = read_job_trace(path)
    assert trace.input_tokens == (10, 11, 12, 13, 14, 15)
    assert trace.output_tokens == (1, 1, 2, 3, 4, 1)  # an empty answer is replayed as one token
    assert trace.skipped == 2 and trace.job_format == "calibrate journal"
    assert trace.gaps_s() == pytest.approx((0.1,) * 5)
    # a journal that mixes lines with and without send times has no pattern to follow
    path.write_text(_line(1, sent=5.0) + _line(2))
    assert read_job_trace(path).sent_at is None


def test_a_long_pause_is_no_gap_of_the_jobs_pace() -> None:
    trace = JobTrace(Path("j"), "calibrate journal", (1, 1, 1), (1, 1, 1), (0.0, 0.5, 3600.0))
    assert trace.gaps_s() == (0.5,)  # a resume an hour later is left out


def test_a_large_job_is_sampled_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_replay, "MAX_ITEMS", 50)
    path = tmp_path / "out.jsonl"
    path.write_text("".join(_line(n) for n in range(1000)))
    trace = read_job_trace(path)
    assert trace.items == 50 and trace.sampled_from == 1000
    assert max(trace.input_tokens) > 500  # a sample of the whole job, not its first lines
    assert read_job_trace(path).input_tokens == trace.input_tokens  # seeded


def test_nothing_finished_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(_line(1, ok=False) + "not json\n")
    with pytest.raises(InputError, match="no finished item"):
        read_job_trace(path)


def test_any_first_requests_are_spread_over_the_whole_job() -> None:
    order = spread_order(1000)
    assert sorted(order) == list(range(1000))
    first = sorted(order[:10])
    assert first[0] == 0 and first[-1] >= 800  # the first ten span small to long items
    trace = JobTrace(Path("j"), "j", tuple(range(1, 101)), tuple(range(100, 0, -1)))
    items = ReplayItems.of(trace)
    assert items.item(0) == (1, 100) and items.item(100) == items.item(0)  # pairs kept, cycled
    assert items.median_input in (50, 51)


def test_the_jobs_arrival_pattern_at_another_rate() -> None:
    gaps = (0.0, 0.0, 0.3, 0.0, 0.0, 0.3)  # bursts of three, then a lull
    times = arrival_times(10.0, 7, arrival="job", job_gaps=gaps)
    assert times[-1] == pytest.approx(0.6)  # six gaps at 10 req/s: 0.6 s in all
    assert times[1] == times[0] and times[3] > times[2]  # the bursts are kept
    assert arrival_times(4.0, 3, arrival="job", job_gaps=(0.0,)) == (0.0, 0.25, 0.5)


def test_the_tolerance_has_teeth() -> None:
    job = list(range(100, 300))
    shape = tuple(percentiles(job))
    same = TokenFit("input tokens", shape, 200, tuple(sorted(job * 2)))
    assert same.close and same.distance < 0.02
    shifted = TokenFit("input tokens", shape, 200, tuple(v + 40 for v in sorted(job)))
    assert not shifted.close  # prompts sized 20 % long: not the job
    few = TokenFit("input tokens", shape, 200, (150, 200, 250))
    assert few.close and few.tolerance > 0.7  # three requests prove little either way

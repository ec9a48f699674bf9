"""What a user of a slow server sees while calibrate works: time left as a clock ("1:30:00",
never "5400 s"), a line before each wait for an answer, and progress plans sized from the
answers' own time (the baseline's, then the tiers' and levels'), not from the minimum windows."""

from __future__ import annotations

import re
from pathlib import Path

from calibrate.numbers import clock_text
from tests.batch_helpers import write_tasks
from tests.helpers import write_config
from tests.mockserver import start_mock


def test_a_duration_reads_as_a_clock_with_hours_once_it_runs_past_one() -> None:
    assert clock_text(42) == "0:42"
    assert clock_text(725.4) == "12:05"
    assert clock_text(5400) == "1:30:00"  # a long batch's ETA, once "ETA 5400 s"
    assert clock_text(-3) == "0:00"


def test_a_batch_in_a_log_says_its_time_left_as_a_clock(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.25, per_token_s=0.001, slots=1) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        tasks = write_tasks(isolated / "tasks.jsonl", 8)
        args = ("--input", str(tasks), "--out", "out.jsonl", "-c", "1", "--progress-s", "0.2")
        result = cli("batch", *args)
    assert result.code == 0, result.err
    etas = re.findall(r"ETA (\S+)", result.err)
    assert etas, result.err
    assert all(re.fullmatch(r"\d+:\d\d", eta) for eta in etas), etas  # never "ETA 2 s"

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


def _took(line: str) -> float:
    found = re.search(r"the baseline's answer took ([0-9.]+) s\)$", line)
    assert found, line
    return float(found.group(1))


def test_single_repro_and_verify_say_what_they_wait_for_before_the_answer(
    cli, isolated: Path
) -> None:
    """Each says one line before its wait: the baseline's time where one exists, else the
    limit it may wait (a 0.3 s answer here: 9.5 s or a minute on a CPU server)."""
    with start_mock(ttft_s=0.3, per_token_s=0.001) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        single = cli("single")
        assert single.code == 0, single.err
        lines = single.err.splitlines()
        assert lines[0] == (
            "single: sending the fixed prompt; waiting for the first answer (timeout_s 30)"
        )
        assert lines[1].startswith("answer: ")  # said before the answer, not with it
        repro = cli("repro", "--runs", "2")
        assert repro.code == 0, repro.err
        said = repro.err.splitlines()[0]
        assert said.startswith("repro: sending the fixed prompt 2 times, one after another")
        assert 0.2 < _took(said) < 3.0  # the baseline's own time, on a busy machine
        verify = cli("verify", "--force")
        said = verify.err.splitlines()[0]
        assert said.startswith("verify: sending the fixed prompt (the baseline's"), verify.err
        assert 0.2 < _took(said) < 3.0
        assert sum("sending the fixed prompt" in line for line in verify.err.splitlines()) == 1

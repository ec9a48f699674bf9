"""What a user of a slow server sees while calibrate works: time left as a clock ("1:30:00",
never "5400 s"), a line before each wait for an answer, and progress plans sized from the
answers' own time (the baseline's, then the tiers' and levels'), not from the minimum windows."""

from __future__ import annotations

import re
import time
from pathlib import Path

from calibrate.cli.views.pace import Growth
from calibrate.numbers import clock_text
from calibrate.report.progress import Plan
from tests.batch_helpers import write_tasks
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import CONSERVATIVE, open_gate


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


def _planned_s(err: str, kind: str) -> tuple[float, float]:
    """The seconds a log's plan line says, (low, high): "ladder: 3 tiers, about 0:04 planned
    (…)", or a range, "about 0:04–0:09 planned" (the high end if answers grow with each size
    and every step runs again to its bound)."""
    found = re.search(
        rf"^{kind}: \d+ \w+, about (\d+):(\d\d)(?:–(\d+):(\d\d))? planned \(sized from the",
        err,
        re.M,
    )
    assert found, err
    low = int(found.group(1)) * 60 + int(found.group(2))
    high = int(found.group(3)) * 60 + int(found.group(4)) if found.group(3) else low
    return low, high


def test_a_ladder_plans_its_tiers_from_the_answers_time_and_says_so_in_a_log(
    cli, isolated: Path
) -> None:
    """2 slots, 0.3 s answers: a wave of 4 waits for two turns. The windows alone planned
    3 tiers × 2 rounds × 0.05 s (0.3 s, and said nothing in a log); each round is a whole wave."""
    extra = (
        f"{CONSERVATIVE}[ladder]\nbatch_sizes = [1, 2, 4]\nrounds = 2\nmin_round_s = 0.05\n"
        "warmup_waves = 0\nsample_interval_s = 0.02\nlatency_rise = 100.0\nmax_rounds = 2\n"
    )
    with start_mock(ttft_s=0.3, per_token_s=0.0005, slots=2) as server:
        write_config(isolated / "calibrate.toml", server.base_url, extra)
        assert cli("single").code == 0
        open_gate(isolated, server.base_url, extra)
        began = time.monotonic()
        ladder = cli("ladder")
        took = time.monotonic() - began
    assert ladder.code == 0, ladder.err
    low, high = _planned_s(ladder.err, "ladder")
    assert low <= took * 3 and took / 3 <= high, (low, high, took)  # never exact: a busy machine


def test_a_sweep_plans_its_levels_by_their_4xc_requests_and_3x_p50_rules(
    cli, isolated: Path
) -> None:
    """One slot, 0.2 s answers, level_s 0.2: level 1 runs 4 requests (0.8 s), level 2 waits
    3× level 1's p50 and for 8 requests at 0.4 s each (1.6 s); repeats × level_s planned 0.4."""
    extra = f"{CONSERVATIVE}[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.2\nrepeats = 1\n"
    with start_mock(ttft_s=0.2, per_token_s=0.0005, slots=1) as server:
        write_config(isolated / "calibrate.toml", server.base_url, extra)
        assert cli("single").code == 0
        open_gate(isolated, server.base_url, extra, stage="ladder")
        began = time.monotonic()
        sweep = cli("sweep")
        took = time.monotonic() - began
    assert sweep.code in (0, 1), sweep.err  # a knee or not: the plan is what is read here
    low, high = _planned_s(sweep.err, "sweep")
    assert low <= took * 3 and took / 3 <= high, (low, high, took)


def test_answer_times_grow_with_the_servers_cap_or_as_measured_never_below_root_b() -> None:
    assert Growth(2.0).at(1) == 2.0 and Growth(2.0).at(4) == 4.0  # √4 before any tier
    assert Growth(2.0, slots=2).at(4) == 4.0 and Growth(2.0, slots=2).at(8) == 8.0
    queued = Growth(2.0, measured=[(1, 2.0), (2, 4.0)])  # doubled with B: a slot each
    assert queued.at(8) == 16.0
    flat = Growth(2.0, measured=[(1, 2.0), (2, 2.0)])  # 2 slots, unknown yet: still √B
    assert flat.at(8) == 4.0


def test_a_terminal_eta_is_the_paced_plan_less_the_running_steps_time() -> None:
    plan = Plan(3, 1.0, pace=lambda i: [10.0, 20.0, 40.0][i])
    assert plan.total_s() == 70.0
    assert plan.left_s(0, 4.0, 4.0) == 66.0
    assert plan.left_s(1, 12.0, 1.0) == 59.0
    assert plan.left_s(1, 40.0, 29.0) == 40.0  # the running tier overran: the rest still left
    assert Plan(4, 30.0).left_s(0, 0.0, 0.0) == 120.0
    assert Plan(4, 30.0).left_s(2, 100.0, 0.0) == 100.0  # no pace: the measured pace

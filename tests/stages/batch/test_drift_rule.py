"""The batch's drift watch on a virtual clock (no thread, no HTTP, no sleep): a closed loop of 4
in flight hands the watch each finished item as the journal would, the clock moves by what each
item took, and the watch ticks once a virtual second. What a user would notice: one warning,
with the numbers and a likely cause, when the server stays slower than its calibration; none
for a healthy batch — not for a slow moment, not when a busy machine makes the client late."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

from calibrate.gpu.noise import MachineNoise
from calibrate.stages.batch.drift import DriftWatch
from calibrate.stages.batch.drift.server import ServerWatch
from calibrate.state.calibrated import Calibrated
from calibrate.state.drift import DriftRecord, records_json, records_of

LABEL = "http://127.0.0.1:8000/v1"
C = 4
# a sweep level at concurrency 4: 20 items/s (its 3 repeats 19–21), 0.2 s a request
CAL = Calibrated(
    "sweep",
    "20261205T000000Z-sweep-ab12cd",
    C,
    C,
    20.0,
    19.0,
    21.0,
    3,
    items=600,
    errors=0,
    latency_p50_s=0.2,
    latency_p99_s=0.26,
    input_tokens_mean=24.0,
    output_tokens_mean=30.0,
    ttft_p50_s=0.026,
    tpot_p50_s=0.006,
    noise_cores=0.1,
    workload="the fixed prompt (24 input tokens)",
)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class Machine:
    """The rest of the machine, as a test scripts it: other processes' cores and the client's
    lateness from now on (what ``NoiseMeter`` measures from /proc and the self-check)."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.others_cores, self.lag_s = clock, 0.1, 0.0

    def mark(self) -> tuple[float]:
        return (self.clock(),)

    def since(self, mark: tuple[float]) -> MachineNoise:
        wall = self.clock() - mark[0]
        return MachineNoise(wall, 2, self.others_cores * wall, 0.0, 2 * wall, self.lag_s)


def drive(
    latency_s: Callable[[int], float],
    n: int = 900,
    *,
    on_item: Callable[[int], None] = lambda i: None,
    machine: Callable[[Clock], Any] | None = Machine,
    server: ServerWatch | None = None,
    cal: Calibrated = CAL,
    failed: Callable[[int], str | None] = lambda i: None,
    shortest_s: float = 2.0,
) -> tuple[DriftWatch, list[str]]:
    """``n`` items through a closed loop of C: item i takes ``latency_s(i)``, so they finish
    C / latency a second; the watch ticks each virtual second (twice a window of
    ``shortest_s``, batch --drift-window-s, under 2 s) and is stopped at the end."""
    clock, warnings, rows = Clock(), [], []
    noise = machine(clock) if machine else None
    watch = DriftWatch(
        cal,
        label=LABEL,
        concurrency=C,
        slots=C,
        cap=C,
        to_run=n,
        replay="out.jsonl",
        warn=warnings.append,
        write=rows.append,
        server=server,
        noise=noise,
        clock=clock,
        cores=2,
        shortest_s=shortest_s,
    )
    watch._mark = noise.mark() if noise else None  # what start() does before its first tick
    tick_s = min(1.0, shortest_s / 2)
    next_tick = tick_s
    for i in range(n):
        on_item(i)
        took = latency_s(i)
        clock.now_s += took / C
        line: dict[str, Any] = {"id": f"t{i}", "ok": True, "seconds": took}
        line["usage"] = {"prompt_tokens": 24, "completion_tokens": 30}
        if (kind := failed(i)) is not None:  # as the journal writes it: an answer, if one came
            line = {"id": f"t{i}", "ok": False, "error": {"kind": kind, "message": kind}}
            line |= {"seconds": took, "usage": line_usage()} if kind == "format" else {}
        watch.seen(line, 30, LABEL)
        while clock.now_s >= next_tick:
            watch.tick()
            next_tick += tick_s
    watch.stop()
    assert len(rows) == len(watch.windows)  # every window written to the run's drift.jsonl
    return watch, warnings


def line_usage() -> dict[str, int]:
    return {"prompt_tokens": 24, "completion_tokens": 30}


def jitter(seed: int, spread: float = 0.1) -> Callable[[int], float]:
    """0.2 s ± ``spread`` (uniform), the same draws for a seed."""
    rng = random.Random(seed)
    draws = [0.2 * rng.uniform(1 - spread, 1 + spread) for _ in range(5000)]
    return draws.__getitem__


def test_a_server_that_slows_after_n_items_warns_once_with_the_numbers_and_a_cause() -> None:
    base = jitter(1)
    watch, warnings = drive(lambda i: base(i) * (3.0 if i >= 300 else 1.0))
    assert len(warnings) == 1, warnings
    said = warnings[0]
    assert said.startswith("drift: the server is slower than calibrated from item ")
    assert "against 20 calibrated (its runs 19–21)" in said
    assert re.search(r"p50 0\.[56]\d* s against 0\.2 s expected", said), said
    assert "likely cause: no cause seen from here" in said
    assert "changed engine? The setting is unchanged" in said  # one sentence ends once
    assert "The setting is unchanged; to measure it again: calibrate sweep" in said
    record = watch.record()
    assert record.compared and record.drifted and record.what == "slower than calibrated"
    assert record.at_item is not None and 300 < record.at_item <= 400  # the first slow window
    assert record.items_per_s is not None and 5.5 < record.items_per_s < 7.5  # 20 / 3
    (read,) = records_of(records_json([record]))  # the ledger reads back what it said
    assert read.line() == record.line() and read.causes == record.causes


def test_a_healthy_batch_never_warns_not_on_slow_moments_nor_on_a_busy_machine() -> None:
    """±30 % jitter, one request in 25 taking 4× as long, a burst of 40 slow items (a pause of
    the server, shorter than three windows), other processes on 1.8 of the 2 cores: none of it
    lasts, so none of it is drift."""
    base = jitter(2, spread=0.3)

    def latency(i: int) -> float:
        slow_moment = 4.0 if i % 25 == 0 or 400 <= i < 440 else 1.0
        return base(i) * slow_moment

    machines: list[Machine] = []

    def busy(i: int) -> None:
        if i == 200:
            machines[0].others_cores = 1.8

    def make(clock: Clock) -> Machine:
        machines.append(Machine(clock))
        return machines[0]

    watch, warnings = drive(latency, on_item=busy, machine=make)
    assert warnings == []
    record = watch.record()
    assert record.compared and not record.drifted and record.judged >= 10
    assert record.line().startswith("drift: none — ")


def test_a_run_too_short_to_find_drift_never_says_none_and_says_what_its_windows_read() -> None:
    """Every item 4× slower than calibrated, but the run is over in two judged windows: drift
    takes three in a row, so none could have been found — "not compared", with what the
    windows read and that both were slow, never "drift: none". (It said "none" before.)"""
    watch, warnings = drive(lambda i: 0.8, n=40)  # 8 s: two windows judged
    record = watch.record()
    assert warnings == [] and 1 <= record.judged < 3, record
    assert not record.compared and not record.drifted and record.said
    line = record.line()
    assert line.startswith("drift: not compared — ") and "drift: none" not in line, line
    assert f"{record.judged} judged window(s) of the run, too few to tell drift" in line, line
    assert f"{record.judged} of them slower or failing" in line, line
    assert "against 20 calibrated (its runs 19–21, within which a latency up to 1.4×" in line, line
    (read,) = records_of(records_json([record]))  # the ledger and status read it back the same
    assert read.line() == line and not read.compared


def test_a_batch_of_seconds_is_judged_in_the_shorter_windows_its_user_asked_for() -> None:
    """A 6 s batch, every item 2× slower than calibrated: in windows of 2 s at least (the
    default) two are judged — too few to tell drift; with ``--drift-window-s 0.5`` its windows
    close once they hold 4 × C items (1.6 s each), and three in a row find the drift."""
    slow = lambda i: 0.4  # noqa: E731 — 10 items/s against 19–21 calibrated
    watch, warnings = drive(slow, n=60)
    record = watch.record()
    assert warnings == [] and record.judged == 2 and not record.compared, record
    watch, warnings = drive(slow, n=60, shortest_s=0.5)
    record = watch.record()
    assert len(warnings) == 1 and record.drifted and record.judged >= 3, record
    assert all(w.seconds < 2 for w in watch.windows), watch.windows


def test_a_slowdown_the_run_ended_inside_never_reads_as_none() -> None:
    """The server 3× slower for the run's last two judged windows: fewer than drift takes in a
    row, so it is not drift — and not "none" either (it said "drift: none" with the whole run's
    rate, which hid the slowdown): "undecided", with what those windows read, in the summary,
    --json and the ledger alike."""
    base = jitter(3)
    watch, warnings = drive(lambda i: base(i) * (3.0 if i >= 350 else 1.0), n=400)
    record = watch.record()
    assert warnings == [] and not record.drifted and record.compared, record
    assert record.undecided in (1, 2) and record.judged >= 3, watch.windows
    line = record.line()
    assert line.startswith("drift: undecided — ") and "drift: none" not in line, line
    assert f"the run's last {record.undecided} judged window(s)" in line, line
    assert record.at_item is not None and 300 < record.at_item <= 400, record
    assert record.items_per_s is not None and record.items_per_s < 10, record  # 20 / 3, not all
    assert re.search(r"p50 0\.[56]\d* s against 0\.2 s expected", line), line
    (read,) = records_of(records_json([record]))
    assert read.line() == line and read.undecided == record.undecided
    # a slow stretch that ended before the run did is still "none": the server came back
    healed, _ = drive(lambda i: base(i) * (3.0 if 350 <= i < 390 else 1.0), n=600)
    assert healed.record().line().startswith("drift: none — "), healed.windows


def test_a_busy_machine_that_makes_the_client_late_is_not_the_servers_drift() -> None:
    """From item 300 other processes take the machine and calibrate's threads run 0.3 s late:
    every answer is read 0.3 s later, 2.5× the calibrated latency. The server made them as fast
    as ever: no warning. The same slowdown with the client on time is the server's: a warning
    that names the busy machine as the likely cause."""
    base = jitter(3)
    machines: list[Machine] = []

    def make(clock: Clock) -> Machine:
        machines.append(Machine(clock))
        return machines[-1]

    def late(lag_said: bool) -> Callable[[int], None]:
        def at(i: int) -> None:
            if i == 300:
                machines[-1].others_cores = 1.8
                machines[-1].lag_s = 0.3 if lag_said else 0.0

        return at

    def latency(i: int) -> float:
        return base(i) + (0.3 if i >= 300 else 0.0)

    _, quiet = drive(latency, on_item=late(True), machine=make)
    assert quiet == []
    watch, warned = drive(latency, on_item=late(False), machine=make)
    assert len(warned) == 1
    assert "likely cause: other processes are using the machine: 1.8 of its 2 cores" in warned[0]
    assert watch.record().causes[0].startswith("other processes are using the machine")


def test_preemptions_from_the_servers_metrics_are_the_likely_cause() -> None:
    """The server's /metrics (vLLM's names) count 50 preemptions once it slows: the warning
    says so and sends the user to the ladder on this job's own token counts."""
    preempted = [0]

    def metrics() -> str:
        return (
            "# TYPE vllm:num_preemptions_total counter\n"
            f'vllm:num_preemptions_total{{model_name="m"}} {preempted[0]}\n'
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {C}\n'
        )

    def server_preempts(i: int) -> None:
        if i >= 300 and i % 6 == 0:
            preempted[0] += 1

    base = jitter(4)
    watch, warnings = drive(
        lambda i: base(i) * (2.5 if i >= 300 else 1.0),
        on_item=server_preempts,
        server=ServerWatch(metrics),
    )
    assert len(warnings) == 1
    assert "likely cause: preemptions +" in warnings[0]
    assert "since the start: the KV cache is full at this setting" in warnings[0]
    assert "to measure it again: calibrate ladder --replay out.jsonl" in warnings[0]
    record = watch.record()
    assert record.preemptions is not None and record.preemptions >= 50
    assert record.rerun == "calibrate ladder --replay out.jsonl"


def test_a_server_restarted_mid_run_still_counts_its_preemptions() -> None:
    """A server up for days (its counter at 10,000 when the batch begins) restarts at item 250
    (the counter starts again at 0), then preempts and slows from item 300: the preemptions are
    counted across the restart, the cause named. (The counter's rise read max(0, 60 − 10,000)
    = 0: "no cause seen from here (no preemptions, …)", and --json said 0 preemptions.)"""
    preempted = [10_000]

    def metrics() -> str:
        return (
            "# TYPE vllm:num_preemptions_total counter\n"
            f'vllm:num_preemptions_total{{model_name="m"}} {preempted[0]}\n'
        )

    def server(i: int) -> None:
        if i == 250:
            preempted[0] = 0  # restarted: a new process, its counters from 0
        elif i >= 300 and i % 6 == 0:
            preempted[0] += 1

    base = jitter(4)
    watch, warnings = drive(
        lambda i: base(i) * (2.5 if i >= 300 else 1.0), on_item=server, server=ServerWatch(metrics)
    )
    assert len(warnings) == 1
    assert "likely cause: preemptions +" in warnings[0], warnings[0]
    record = watch.record()
    assert record.preemptions is not None and 50 <= record.preemptions <= 100, record


def test_errors_over_the_calibrations_rate_are_drift_too() -> None:
    """From item 300 one request in four fails: the batch is failing more than calibrated."""
    base = jitter(5)
    _, warnings = drive(base)
    assert warnings == []  # the same run without errors: nothing to say
    failing = _drive_failing(base)
    assert len(failing[1]) == 1
    assert "failing more than calibrated" in failing[1][0]
    assert "likely cause: errors: " in failing[1][0] and "server_error×" in failing[1][0]
    assert failing[0].record().rerun == "calibrate single"


def _drive_failing(base: Callable[[int], float]) -> tuple[DriftWatch, list[str]]:
    """``drive`` with every fourth item from 300 on a server error."""
    clock, warnings = Clock(), []
    watch = DriftWatch(
        CAL,
        label=LABEL,
        concurrency=C,
        slots=C,
        cap=C,
        to_run=900,
        replay="out.jsonl",
        warn=warnings.append,
        write=lambda row: None,
        clock=clock,
        cores=2,
    )
    next_tick = 1.0
    for i in range(900):
        clock.now_s += base(i) / C
        failed = i >= 300 and i % 4 == 0
        line: dict[str, Any] = {"id": f"t{i}", "ok": not failed, "seconds": base(i)}
        if failed:
            line["error"] = {"kind": "server_error", "message": "HTTP 500"}
        else:
            line["usage"] = {"prompt_tokens": 24, "completion_tokens": 30}
        watch.seen(line, 30, LABEL)
        while clock.now_s >= next_tick:
            watch.tick()
            next_tick += 1.0
    watch.stop()
    return watch, warnings


def test_a_calibration_whose_own_runs_disagree_widely_holds_a_batch_to_less() -> None:
    """Its repeats 12–28 items/s: a batch 1.5× slower is within what it measured (no warning);
    the same slowdown against a tight calibration is drift."""
    from dataclasses import replace

    base = jitter(6)
    slower = lambda i: base(i) * (1.5 if i >= 300 else 1.0)  # noqa: E731
    _, wide = drive(slower, cal=replace(CAL, items_per_s_low=12.0, items_per_s_high=28.0))
    assert wide == []
    _, tight = drive(slower)
    assert len(tight) == 1


def test_a_calibration_too_wide_to_hold_a_batch_to_says_so_never_none() -> None:
    """Its runs 5–24 items/s around 9 (measured beside CPU burners): a batch that slows 2× is
    within it, so "none" would be a verdict surer than the measurement — the record says the
    calibration cannot tell, and what to run; a tight one finds the same slowdown."""
    from dataclasses import replace

    base = jitter(7)
    slower = lambda i: base(i) * (2.0 if i >= 300 else 1.0)  # noqa: E731
    noisy = replace(CAL, items_per_s=9.0, items_per_s_low=5.0, items_per_s_high=24.0)
    watch, warnings = drive(slower, cal=noisy)
    record = watch.record()
    assert warnings == [] and not record.compared and not record.drifted
    assert record.line() == (
        "drift: not compared — sweep run 20261205T000000Z-sweep-ab12cd at concurrency 4 "
        "measured 9 items/s, its runs 5–24: too far apart to tell a slower server from its own "
        "noise (its failures are judged all the same: none lasted). Measure it again on a "
        "quieter machine: calibrate sweep"
    )
    assert record.said and record.rerun == "calibrate sweep"  # the batch's summary says it
    (back,) = records_of(records_json([record]))
    assert back.said and back.line() == record.line()
    nothing = DriftRecord(False, "nothing is calibrated for it", endpoint=LABEL)
    assert not nothing.said  # nothing to do about it: --json, the run and status say why
    tight, _ = drive(slower)
    assert tight.record().drifted and tight.record().said


def test_answers_failing_the_users_format_check_are_no_drift_of_the_server() -> None:
    """`--expect json` over a prompt that makes prose: from item 300 on every answer fails the
    user's own check, at the calibrated pace. The watch said "drift: the server is failing more
    than calibrated … errors 100 % (format×…) … calibrate single". The same failures as HTTP 500s
    are the server's, and still warned of."""
    formats, _ = drive(jitter(3), failed=lambda i: "format" if i >= 300 else None)
    assert formats.finding is None and all(w.errors == 0 for w in formats.windows)
    served, warned = drive(jitter(3), failed=lambda i: "http_5xx" if i >= 300 else None)
    assert served.finding is not None and len(warned) == 1 and "http_5xx" in warned[0]


def test_every_record_reads_back_from_json_saying_the_same_line_word_for_word() -> None:
    """A batch's --junit says the live record's drift line; its summary and ``status`` say the
    one read back from JSON. The JSON rounded items/s to 3 decimals and the line then took 3
    figures: 10.7496 read "10.7" live and "10.8" back (a fresh clone's make test, `--workers 2`).
    Over random paces, calibrations and kinds of record, the line read back is the line said."""
    rng = random.Random(29)
    for i in range(2000):
        pace = rng.choice([rng.uniform(0.001, 5000), round(rng.uniform(1, 99), 2) + 0.0049996])
        mid = rng.uniform(0.01, 900)
        cal = Calibrated("ladder", "20261207T173010Z-ladder-492920", 4, 4, mid, mid, mid, 1)
        record = DriftRecord(
            True,
            "the server is slower than calibrated",
            drifted=i % 3 != 0,
            what="slower than calibrated",
            calibration=Calibrated.from_json(cal.to_json()),  # the ledger's, as a batch reads it
            at_item=rng.randint(1, 10**6),
            items_per_s=pace,
            undecided=2 if i % 6 == 0 else 0,
            causes=("no cause seen from here",),
            rerun="calibrate sweep",
            left_out=(("restart", 1),) if i % 5 == 0 else (),
        )
        (back,) = records_of(json.loads(json.dumps(records_json([record]))))
        assert back.line() == record.line(), (pace, record.line(), back.line())

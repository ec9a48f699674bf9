"""A batch's drift watch across an outage and a restart of its server, on a virtual clock (no
thread, no HTTP, no sleep). A window that held the server's downtime, or the start of another
process of it, is left out — its numbers are the outage's — and a run of slow windows never
spans it: the windows either side may be two servers (the old one slowing before it died, the
new one cold or started with other flags). What a user would notice: no drift warning that
mixes the two, the drift of the server after the restart still found on its own windows, and
the summary and ``status`` saying how many windows were left out and why."""

from __future__ import annotations

import random
from typing import Any

from calibrate.stages.batch.drift import BatchDrift, DriftWatch
from calibrate.state.drift import records_json, records_of
from tests.stages.batch.drift_fakes import CAL, FAST, LABEL, SLOW, C


class Run:
    """A closed loop of C in flight on a virtual clock, told to the watch as the journal and the
    breaker tell it: each finished item (``items``), an outage (``outage``); the watch ticks
    once a virtual second."""

    def __init__(self) -> None:
        self.now_s, self.next_tick, self.done = 0.0, 1.0, 0
        self.warnings: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self.rng = random.Random(7)
        self.watch = DriftWatch(
            CAL,
            label=LABEL,
            concurrency=C,
            slots=C,
            cap=C,
            to_run=1_000_000,  # never "the run's last items": the run's end is stop()'s
            replay="out.jsonl",
            warn=self.warnings.append,
            write=self.rows.append,
            clock=lambda: self.now_s,
            cores=2,
        )
        self.drift = BatchDrift([self.watch])  # as the batch tells it its outage events

    def _ticks(self) -> None:
        while self.now_s >= self.next_tick:
            self.watch.tick()
            self.next_tick += 1.0

    def items(self, latency_s: float, judged: int) -> int:
        """Items of ``latency_s`` (±10 %) until ``judged`` more judged windows closed; the
        first item's number."""
        first, target = self.done + 1, self.judged() + judged
        while self.judged() < target:
            took = latency_s * self.rng.uniform(0.9, 1.1)
            self.now_s += took / C
            self.done += 1
            line = {"id": f"t{self.done}", "ok": True, "seconds": took}
            line["usage"] = {"prompt_tokens": 24, "completion_tokens": 30}
            self.watch.seen(line, 30, LABEL)
            self._ticks()
        return first

    def outage(self, down_s: float, restart: bool) -> None:
        """The server gone for ``down_s`` (the breaker's ``down``), restarted at its end if
        ``restart`` (``batch --restart``), then answering again (``up``)."""
        self.drift.outage(LABEL, "down")
        self.now_s += down_s
        self._ticks()
        if restart:
            self.drift.outage(LABEL, "restart")
        self.drift.outage(LABEL, "up")

    def judged(self) -> int:
        return sum(w.judged for w in self.watch.windows)

    def stop(self) -> Any:
        self.drift.stop()
        return self.watch.record()


def test_slow_windows_either_side_of_a_restart_are_no_drift_and_the_summary_says_so() -> None:
    """The server slows 3× for two windows, dies, is restarted, is slow for two windows more
    (cold), then keeps its calibrated pace. Four slow windows, never three of one server: no
    warning. (It warned "drift: the server is slower than calibrated from item …", the run
    being two windows of the old server and one of the new.) The summary's line says the
    windows left out and why, and reads back from the ledger the same."""
    run = Run()
    run.items(FAST, judged=3)
    run.items(SLOW, judged=2)
    run.outage(5.0, restart=True)
    run.items(SLOW, judged=2)
    run.items(FAST, judged=4)
    record = run.stop()
    assert run.warnings == [], run.warnings
    assert record.compared and not record.drifted and not record.undecided, record
    left = [w for w in run.watch.windows if w.left_out]
    assert left and not any(w.judged for w in left)
    assert left[-1].left_out == "restart"
    assert sum(n for _, n in record.left_out) == len(left), record.left_out
    line = record.line()
    assert line.startswith("drift: none — "), line
    assert "that held a restart of the server, not comparable with the calibration" in line
    assert "no run of windows spans one" in line, line
    assert [r["left_out"] for r in run.rows] == [w.left_out for w in run.watch.windows]
    (back,) = records_of(records_json([record]))  # the ledger, and so status, say the same
    assert back.line() == line and back.left_out == record.left_out


def test_after_an_outage_drift_is_found_on_the_windows_of_the_server_that_came_back() -> None:
    """Two slow windows, an outage (no restart of calibrate's: the server came back by itself),
    then a server slow for good: drift, from the first slow window after the outage — not from
    the old server's windows before it (it said "from item" of the first slow window before)."""
    run = Run()
    run.items(FAST, judged=3)
    before = run.items(SLOW, judged=2)
    run.outage(4.0, restart=False)
    after = run.items(SLOW, judged=4)
    record = run.stop()
    assert len(run.warnings) == 1, run.warnings
    assert record.drifted and record.at_item is not None, record
    assert record.at_item >= after > before, (record.at_item, after, before)
    finding = run.watch.finding
    assert finding is not None
    gap = max(w.index for w in run.watch.windows if w.left_out)
    assert all(w.index > gap for w in finding.windows), finding.windows
    assert "left out: 1 window that held an outage" in record.line() or (
        "left out: 2 windows that held an outage" in record.line()
    ), record.line()


def test_a_slowdown_the_run_ended_inside_counts_only_the_windows_since_the_outage() -> None:
    """One slow window, an outage, one slow window, the end: "undecided" over the one window
    after the outage (it said "the run's last 2 judged window(s)", from the old server's)."""
    run = Run()
    run.items(FAST, judged=4)
    run.items(SLOW, judged=1)
    run.outage(4.0, restart=True)
    after = run.items(SLOW, judged=1)
    record = run.stop()
    assert record.compared and not record.drifted and record.undecided == 1, record
    assert record.at_item is not None and record.at_item >= after, (record.at_item, after)
    assert "the run's last 1 judged window(s)" in record.line(), record.line()


def test_too_few_windows_between_outages_is_too_few_to_tell_never_none() -> None:
    """Two judged windows, an outage, two more: four judged, but never three of one server in a
    row — drift could not have been found, so none is claimed."""
    run = Run()
    run.items(SLOW, judged=2)
    run.outage(3.0, restart=True)
    run.items(SLOW, judged=2)
    record = run.stop()
    assert run.warnings == [] and not record.compared and record.judged == 4, record
    line = record.line()
    assert line.startswith(
        "drift: not compared — 4 judged window(s) of the run, at most 2 in a row "
        "between outages or restarts, too few to tell drift"
    ), line
    assert "left out: " in line

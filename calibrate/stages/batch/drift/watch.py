"""The drift watch: an observer of a batch's finished items, on a thread of its own.

The journal's thread hands it each counted line (``seen``: a few additions under a lock, in the
parent process with --workers N too, where every line is journaled). Its own thread (``tick``,
about once a second) reads the server's /metrics, closes a window when one is due, notes what
the rest of the machine did over it, writes it to the run's ``drift.jsonl``, and asks the rule
whether the batch has drifted; the first time it has, one warning. It sends nothing, changes
nothing, and never touches the send path.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from statistics import median
from typing import Any

from calibrate.gpu.noise import NoiseMark, NoiseMeter
from calibrate.stages.batch.drift.causes import Cause, causes, warning
from calibrate.stages.batch.drift.rule import (
    IN_A_ROW,
    Basis,
    Finding,
    basis_of,
    ended_inside,
    is_failing,
    is_slow,
    judge,
    latency_bound,
    lowest_items_per_s,
    run_at_end,
    too_wide,
)
from calibrate.stages.batch.drift.server import ServerWatch
from calibrate.stages.batch.drift.windows import Gathering, Window, window_due
from calibrate.state.calibrated import Calibrated
from calibrate.state.drift import DriftRecord

log = logging.getLogger("calibrate")

TICK_S = 1.0
JOIN_S = 5.0  # stopping: how long a scrape under way may take
MAX_WINDOWS = 100_000  # kept for the rule (a window is at least 2 s: about 55 hours' worth)


class DriftWatch:
    """Holds one endpoint's windows against ``cal``; ``stop`` returns what it found."""

    def __init__(
        self,
        cal: Calibrated,
        *,
        label: str,
        concurrency: int,
        slots: int,
        cap: int,
        to_run: int,
        replay: str,
        warn: Callable[[str], None],
        write: Callable[[dict[str, Any]], None],
        server: ServerWatch | None = None,
        noise: NoiseMeter | None = None,
        clock: Callable[[], float] = time.monotonic,
        cores: int | None = None,
    ) -> None:
        self.cal = cal
        self._label, self._concurrency, self._slots, self._cap = label, concurrency, slots, cap
        self._to_run, self._replay = to_run, replay
        self._warn, self._write = warn, write
        self._server, self._noise, self._clock = server, noise, clock
        self._cores = cores or os.cpu_count() or 1
        self._lock = threading.Lock()
        self._gathering: Gathering | None = None
        self._run_start = 0.0
        self._finished = 0  # every endpoint's items
        self._down = False
        self._mark: NoiseMark | None = None
        self.windows: list[Window] = []
        self.basis: Basis | None = None
        self.finding: Finding | None = None
        self._said = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # the journal's thread
    def seen(self, line: dict[str, Any], tokens: int | None, endpoint: str) -> None:
        """One counted line (``tokens``: its output tokens, read from the line's usage)."""
        with self._lock:
            self._finished += 1
            if endpoint != self._label:
                return
            if self._gathering is None:  # the run's clock starts at its first finished item
                self._run_start = self._clock()
                self._gathering = Gathering(self._run_start)
            self._gathering.add(line)
            if self._down:
                self._gathering.outage = True

    # the outage's
    def quiet(self, endpoint: str, down: bool) -> None:
        """The endpoint went down (an outage pauses dispatch) or answered again."""
        if endpoint != self._label:
            return
        with self._lock:
            self._down = down
            if self._gathering is not None:
                self._gathering.outage = True

    # its own
    def start(self) -> DriftWatch:
        self._thread = threading.Thread(target=self._loop, name="batch-drift", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        self._mark = self._noise_mark()
        while not self._stop.wait(TICK_S):
            try:
                self.tick()
            except Exception:  # the watch must never end the batch: it stops watching
                log.exception("drift: the watch stopped")
                return

    def tick(self) -> Window | None:
        """Read the server; close the window when it is due (returned)."""
        if self._server is not None:
            self._server.read()
        with self._lock:
            gathering = self._gathering
            now = self._clock()
            if gathering is None:
                return None
            run_s = now - self._run_start
            due = window_due(gathering.items, now - gathering.started_s, run_s, self._concurrency)
            if not due:
                return None
            window = gathering.close(len(self.windows), self._run_start, now, self._finished)
            self._gathering = Gathering(now, self._finished + 1, seed=len(self.windows) + 1)
            if self._down:
                self._gathering.outage = True
        return self._closed(window)

    def _closed(self, window: Window) -> Window:
        noise = self._noise.since(self._mark) if self._noise and self._mark is not None else None
        self._mark = self._noise_mark()
        ending = self._to_run - window.finished < self._slots
        window = replace(
            window,
            server=self._server.window() if self._server is not None else None,
            others_cores=noise.others_cores if noise else None,
            steal_share=noise.steal_share if noise else None,
            client_lag_s=noise.client_lag_s if noise else None,
            judged=window.judged and not ending,
            why_not=window.why_not or ("the run's last items" if ending else ""),
        )
        if len(self.windows) < MAX_WINDOWS:
            self.windows.append(window)
        try:
            self._write(window.to_json())
        except OSError as exc:  # the run's folder is full or gone: the summary still says it
            log.debug("drift: window not written: %s", exc)
        if self.basis is None and window.judged:
            self.basis = basis_of(self.cal, *self._token_means())
        if self.finding is None and self.basis is not None:
            self.finding = judge(self.cal, self.basis, self.windows)
            if self.finding is not None:
                self._said = warning(self.cal, self.basis, self.finding, self._causes())
                self._warn(self._said)
        return window

    def _noise_mark(self) -> NoiseMark | None:
        return self._noise.mark() if self._noise is not None else None

    def _token_means(self) -> tuple[float | None, float | None]:
        def mean(pairs: list[tuple[float, int]]) -> float | None:
            weight = sum(n for _, n in pairs)
            return sum(v * n for v, n in pairs) / weight if weight else None

        ins = [(v, w.items) for w in self.windows if (v := w.input_tokens_mean) is not None]
        outs = [(v, w.items) for w in self.windows if (v := w.output_tokens_mean) is not None]
        return mean(ins), mean(outs)

    def _causes(self) -> tuple[Cause, ...]:
        assert self.finding is not None
        first = self.finding.windows[0].index
        return causes(
            self.cal,
            self.finding,
            cap=self._cap,
            concurrency=self._concurrency,
            cores=self._cores,
            replay=self._replay,
            before=[w for w in self.windows if w.judged and w.index < first],
        )

    def stop(self) -> DriftRecord:
        """Stop watching; the last, partial window is kept unjudged (the run's end)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_S)
        with self._lock:
            gathering, self._gathering = self._gathering, None
            now = self._clock()
        if gathering is not None and gathering.items:
            last = gathering.close(len(self.windows), self._run_start, now, self._finished)
            self._closed_quietly(last)
        return self.record()

    def _closed_quietly(self, window: Window) -> None:
        window = replace(window, judged=False, why_not=window.why_not or "the run's end")
        self.windows.append(window)
        try:
            self._write(window.to_json())
        except OSError as exc:
            log.debug("drift: window not written: %s", exc)

    def record(self) -> DriftRecord:
        """What the watch found so far, for the summary and the ledger."""
        cal, basis, finding = self.cal, self.basis, self.finding
        judged = [w for w in self.windows if w.judged]
        where = f"compared {basis.text if basis else ''} with {cal.where}"
        if basis is None or basis.kind is None:
            why = basis.text if basis else "no window of the run was long enough to judge"
            return DriftRecord(
                False, why, calibration=cal, endpoint=self._label, windows=len(self.windows)
            )
        if finding is None and lowest_items_per_s(cal) <= 0:
            return DriftRecord(
                False,
                too_wide(cal),
                calibration=cal,
                endpoint=self._label,
                windows=len(self.windows),
                rerun=f"calibrate {cal.stage}",
            )
        off = sum(1 for w in judged if is_slow(cal, basis, w) or is_failing(cal, w))
        # fewer judged windows than drift takes in a row: none could have been found, so none
        # is claimed — what they read is said, and how many of them were off
        too_few = finding is None and len(judged) < IN_A_ROW
        # a slowdown the run ended inside (fewer windows than drift takes): not drift, and
        # not "none" either — the whole run's rate hid a server 3× slower at its end
        ending = () if finding is not None or too_few else run_at_end(cal, basis, judged)
        shown = list(finding.windows) if finding else list(ending) or judged
        seconds = sum(w.seconds for w in shown)
        items = sum(w.items for w in shown)
        p50s = [w.latency_p50_s for w in shown if w.latency_p50_s is not None]
        p99s = [w.latency_p99_s for w in shown if w.latency_p99_s is not None]
        rise = [
            w.server.preemptions
            for w in self.windows
            if w.server and w.server.preemptions is not None
        ]
        rate = items / seconds if seconds > 0 else None
        if finding is None:
            # how much slower a server could be and still read within the calibration's noise:
            # "none" is never surer than that (a 4× slower mock read as none beside runs of
            # 16.3–27.3 items/s, which admit 3.9×)
            admits = (
                f"{cal.items_per_s:.3g} calibrated (its runs {cal.items_per_s_low:.3g}–"
                f"{cal.items_per_s_high:.3g}, within which a latency up to "
                f"{latency_bound(cal):.2g}× the expected reads as no drift)"
            )
            text = (
                f"{rate or 0:.3g} items/s against {admits} over {len(judged)} judged "
                f"window(s), {where}"
            )
            if too_few:
                text = (
                    f"{len(judged)} judged window(s) of the run, too few to tell drift (it takes "
                    f"{IN_A_ROW} in a row), {off} of them slower or failing: {text}"
                )
            elif ending:
                text = ended_inside(cal, ending, rate, admits, len(judged), where)
        else:
            text = self._said
        found = self._causes() if finding else ()
        first = finding.windows[0] if finding else ending[0] if ending else None
        return DriftRecord(
            not too_few,
            text,
            drifted=finding is not None,
            what=finding.what if finding else "",
            calibration=cal,
            basis=basis.kind,
            endpoint=self._label,
            windows=len(self.windows),
            judged=len(judged),
            off=off,
            undecided=len(ending),
            causes=tuple(c.text for c in found),
            rerun=found[0].rerun if found else None,
            at_item=first.first_item if first else None,
            items_per_s=rate,
            latency_p50_s=median(p50s) if p50s else None,
            latency_p99_s=max(p99s) if p99s else None,
            error_rate=sum(w.errors for w in shown) / items if items else None,
            preemptions=max(rise) if rise else None,
        )

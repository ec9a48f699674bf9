"""The drift watch: an observer of a batch's finished items, on a thread of its own.

The journal's thread hands it each counted line (``seen``: a few additions under a lock, in the
parent process with --workers N too, where every line is journaled). Its own thread (``tick``,
about once a second, or twice a window when ``--drift-window-s`` asks for windows under 2 s)
reads the server's /metrics, closes a window when one is due, notes what the rest of the
machine did over it, writes it to the run's ``drift.jsonl``, and asks the rule
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
from typing import Any

from calibrate.gpu.noise import NoiseMark, NoiseMeter
from calibrate.stages.batch.drift.causes import Cause, causes, warning
from calibrate.stages.batch.drift.record import record_of
from calibrate.stages.batch.drift.rule import (
    Basis,
    Finding,
    basis_of,
    judge,
)
from calibrate.stages.batch.drift.server import ServerWatch
from calibrate.stages.batch.drift.windows import MIN_WINDOW_S, Gathering, Window, window_due
from calibrate.state.calibrated import Calibrated
from calibrate.state.drift import DriftRecord

log = logging.getLogger("calibrate")

TICK_S = 1.0  # or half the shortest window, when that is less
JOIN_S = 5.0  # stopping: how long a scrape under way may take
MAX_WINDOWS = 100_000  # kept for the rule (a window of 2 s: about 55 hours' worth; 0.5 s: 14)


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
        shortest_s: float = MIN_WINDOW_S,
    ) -> None:
        self.cal = cal
        self._label, self._concurrency, self._slots, self._cap = label, concurrency, slots, cap
        self._to_run, self._replay = to_run, replay
        self._warn, self._write = warn, write
        self._server, self._noise, self._clock = server, noise, clock
        self._cores = cores or os.cpu_count() or 1
        self._shortest_s = shortest_s  # --drift-window-s
        self._tick_s = min(TICK_S, shortest_s / 2)
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
                self._gathering.leave_out("outage")

    # the outage's
    def quiet(self, endpoint: str, down: bool) -> None:
        """The endpoint went down (an outage pauses dispatch) or answered again: the window
        that holds either is left out."""
        if endpoint != self._label:
            return
        with self._lock:
            self._down = down
            if self._gathering is not None:
                self._gathering.leave_out("outage")

    def restarted(self, endpoint: str) -> None:
        """Another process of the endpoint's server began (``batch --restart``): the window
        that holds it is left out, and a run of windows starts again after it."""
        if endpoint != self._label:
            return
        if self._server is not None:
            self._server.restarted()  # its next reading is the new process's
        with self._lock:
            if self._gathering is not None:
                self._gathering.leave_out("restart")

    # its own
    def start(self) -> DriftWatch:
        self._thread = threading.Thread(target=self._loop, name="batch-drift", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        self._mark = self._noise_mark()
        while not self._stop.wait(self._tick_s):
            try:
                self.tick()
            except Exception:  # the watch must never end the batch: it stops watching
                log.exception("drift: the watch stopped")
                return

    def tick(self) -> Window | None:
        """Read the server; close the window when it is due (returned). A scrape that found
        nothing listening, or another process of the server, leaves the window out."""
        heard = self._server.read() if self._server is not None else None
        with self._lock:
            gathering = self._gathering
            now = self._clock()
            if gathering is None:
                return None
            if heard == "down" or heard == "restarted":
                gathering.leave_out("outage" if heard == "down" else "restart")
            run_s = now - self._run_start
            seconds = now - gathering.started_s
            due = window_due(gathering.items, seconds, run_s, self._concurrency, self._shortest_s)
            if not due:
                return None
            window = gathering.close(len(self.windows), self._run_start, now, self._finished)
            self._gathering = Gathering(now, self._finished + 1, seed=len(self.windows) + 1)
            if self._down:
                self._gathering.leave_out("outage")
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
        found = self._causes() if self.finding else ()
        return record_of(
            self.cal,
            self.basis,
            self.finding,
            self.windows,
            endpoint=self._label,
            said=self._said,
            found=found,
        )

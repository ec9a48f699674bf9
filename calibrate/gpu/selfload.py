"""Is calibrate itself the bottleneck? Its own CPU near one core, or its threads starved.

One Python process gets about one core of Python work. When the client's process burns close
to that, or a timer thread wakes up late because request threads hold the interpreter,
requests are waiting on the client rather than the server: a throughput measured then is
calibrate's limit, not the GPU's. Ladder, sweep and batch run a ``SelfLoadMonitor`` and warn.

    monitor = SelfLoadMonitor().start()
    ...                                   # the measured work
    if (text := monitor.poll_warning()): warn(text)   # at most once
    report = monitor.stop()               # SelfLoadReport for summaries

While an endpoint is down (a batch's outage: nothing is being sent to it, workers wait on
probes) the client's load says nothing about the server: ``quiet(name, True)`` until
``quiet(name, False)``, and no window in between counts toward a bottleneck.

**A server on this machine's CPU is not the client's fault.** A CPU engine (vLLM's CPU build,
llama.cpp without a GPU) on the machine calibrate runs on takes the cores calibrate's threads
would run on: the timer wakes late because the server is working, not because calibrate is. Given
``server_cpu`` (the server's processes' CPU seconds so far), a window whose lateness came while
the server used at least half the machine's cores is not client-bound on lateness (calibrate's
own CPU near a core still is): the throughput measured is the server's on this machine's CPU.

A sweep asks per level: ``mark = monitor.mark()`` before it, ``monitor.bound_since(mark)`` after
(the reason, or "" when the client kept up during that level).

``batch --workers N`` checks each process against its core and, in the parent, all of them
together against the machine (``tree_cpu``: the parent's CPU and its workers'): N workers that
each keep up can still, together, take every core the machine has.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Clock = Callable[[], float]

DEFAULT_ADVICE = "lower -c, or run on a faster CPU"
SERVER_SHARE = 0.5  # the server's processes on this share of the cores: late threads are its doing


@dataclass(frozen=True)
class SelfLoadSample:
    """One window: CPU seconds per wall second (1.0 = one core) and mean timer lateness."""

    cpu_fraction: float
    lag_s: float
    server_cores: float | None = None  # the server's processes' CPU in the window (None: unknown)


@dataclass(frozen=True)
class SelfLoadReport:
    windows: int
    cpu_fraction_max: float
    cpu_fraction_mean: float
    lag_max_s: float
    bottleneck: bool
    reason: str

    def to_json(self) -> dict[str, object]:
        return {
            "windows": self.windows,
            "cpu_fraction_max": round(self.cpu_fraction_max, 3),
            "cpu_fraction_mean": round(self.cpu_fraction_mean, 3),
            "lag_max_s": round(self.lag_max_s, 4),
            "bottleneck": self.bottleneck,
            "reason": self.reason,
        }


OWN = "calibrate's own process"  # who a monitor watches unless told (``who``)


class SelfLoadMonitor:
    """Samples this process's CPU time and a timer's lateness in windows on a daemon thread.

    A window is client-bound when CPU ≥ ``cpu_limit`` cores or the timer's mean lateness ≥
    ``lag_limit_s``; ``confirm`` client-bound windows in a row make it a bottleneck.
    """

    def __init__(
        self,
        *,
        window_s: float = 1.0,
        tick_s: float = 0.05,
        cpu_limit: float = 0.85,
        lag_limit_s: float = 0.015,
        confirm: int = 2,
        clock: Clock = time.perf_counter,
        cpu_clock: Clock = time.process_time,
        advice: str = DEFAULT_ADVICE,
        who: str = OWN,
        of_cores: int | None = None,
        server_cpu: Callable[[], float | None] | None = None,
        cores: int | None = None,
    ) -> None:
        self.window_s = window_s
        self.who = who  # what used the CPU, in words ("calibrate's 3 processes")
        self.of_cores = of_cores  # the machine's cores, said with the figure when given
        self.tick_s = tick_s
        self.cpu_limit = cpu_limit
        self.lag_limit_s = lag_limit_s
        self.confirm = confirm
        self.advice = advice  # what to do about it, said with the warning
        self._server_cpu = server_cpu  # the server's processes' CPU seconds so far (None: unknown)
        self.cores = cores or os.cpu_count() or 1
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._samples: list[SelfLoadSample] = []
        self._streak = 0
        self._cause_text = ""  # what made it client-bound; the advice is added when it is said
        self._warned = False
        self._quiet: set[str] = set()  # what is down now (``quiet``): windows do not count
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def observe(
        self, wall_s: float, cpu_s: float, lag_s: float, server_cpu_s: float | None = None
    ) -> SelfLoadSample:
        """Account one window (also how tests drive the monitor without a thread);
        ``server_cpu_s``: what the server's processes used in it (None: unknown)."""
        per_s = 1 / wall_s if wall_s > 0 else 0.0
        server = server_cpu_s * per_s if server_cpu_s is not None else None
        sample = SelfLoadSample(cpu_s * per_s, lag_s, server)
        with self._lock:
            if self._quiet:  # an outage: no load is being sent, nothing to judge
                self._streak = 0
                return sample
            self._samples.append(sample)
            bound = self.bound(sample)
            self._streak = self._streak + 1 if bound else 0
            if self._streak >= self.confirm and not self._cause_text:
                self._cause_text = self._cause(sample)
        return sample

    def bound(self, sample: SelfLoadSample) -> bool:
        """Whether the client was the limit in ``sample``'s window: its own CPU near a core, or
        its threads late while the server did not hold half the machine's cores."""
        if sample.cpu_fraction >= self.cpu_limit:
            return True
        server_working = (
            sample.server_cores is not None and sample.server_cores >= SERVER_SHARE * self.cores
        )
        return sample.lag_s >= self.lag_limit_s and not server_working

    def quiet(self, name: str, down: bool) -> None:
        """``name`` (an endpoint, or a stage's time between its loads) went down (``down``) or
        came back: while any is down no window counts toward a bottleneck, and the streak
        starts again after."""
        with self._lock:
            if down:
                self._quiet.add(name)
            else:
                self._quiet.discard(name)
            self._streak = 0

    def mark(self) -> int:
        """Where the windows measured so far end: ``bound_since`` looks only after it."""
        with self._lock:
            return len(self._samples)

    def bound_since(self, mark: int) -> str:
        """Why the client was the bottleneck in the windows after ``mark`` (``confirm`` of them
        client-bound in a row, e.g. "calibrate's own process used 0.97 CPU cores"), or ""."""
        with self._lock:
            samples = self._samples[mark:]
        streak = 0
        for sample in samples:
            streak = streak + 1 if self.bound(sample) else 0
            if streak >= self.confirm:
                return self._cause(sample)
        return ""

    def lag_since(self, mark: int) -> float | None:
        """The timer's mean lateness over the windows after ``mark`` (None: none measured)."""
        with self._lock:
            samples = self._samples[mark:]
        return sum(s.lag_s for s in samples) / len(samples) if samples else None

    def _cause(self, sample: SelfLoadSample) -> str:
        """What made a window client-bound, in words."""
        if sample.cpu_fraction >= self.cpu_limit:
            of = f" of this machine's {self.of_cores}" if self.of_cores else ""
            return f"{self.who} used {sample.cpu_fraction:.2f}{of} CPU cores"
        threads = "calibrate's threads" if self.who == OWN else f"the threads of {self.who}"
        return f"{threads} waited {sample.lag_s * 1000:.0f} ms on average to run"

    @property
    def bottleneck(self) -> bool:
        with self._lock:
            return bool(self._cause_text)

    @property
    def _reason(self) -> str:
        """The warning: its cause, with the advice as it stands now (a stage may set the advice
        after the monitor started, e.g. once it knows whether ``--workers`` are sending)."""
        return _describe(self._cause_text, self.advice) if self._cause_text else ""

    def poll_warning(self) -> str | None:
        """The bottleneck warning, the first time it is asked for after it was detected."""
        with self._lock:
            if not self._cause_text or self._warned:
                return None
            self._warned = True
            return self._reason

    def report(self) -> SelfLoadReport:
        with self._lock:
            samples = list(self._samples)
            reason = self._reason
        cpu = [s.cpu_fraction for s in samples] or [0.0]
        return SelfLoadReport(
            windows=len(samples),
            cpu_fraction_max=max(cpu),
            cpu_fraction_mean=sum(cpu) / len(cpu),
            lag_max_s=max((s.lag_s for s in samples), default=0.0),
            bottleneck=bool(reason),
            reason=reason,
        )

    def start(self) -> SelfLoadMonitor:
        """Start sampling (a started monitor goes on as it is)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="calibrate-selfload", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> SelfLoadReport:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.report()

    def _run(self) -> None:
        wall0, cpu0, server0 = self._clock(), self._cpu_clock(), self._server_cpu_s()
        lag_total, ticks = 0.0, 0
        while not self._stop.is_set():
            before = self._clock()
            if self._stop.wait(self.tick_s):
                break
            lag_total += max(0.0, self._clock() - before - self.tick_s)
            ticks += 1
            now = self._clock()
            if now - wall0 >= self.window_s:
                cpu, server = self._cpu_clock(), self._server_cpu_s()
                used = (
                    max(0.0, server - server0)
                    if server is not None and server0 is not None
                    else None
                )
                self.observe(now - wall0, cpu - cpu0, lag_total / max(ticks, 1), used)
                wall0, cpu0, server0, lag_total, ticks = now, cpu, server, 0.0, 0

    def _server_cpu_s(self) -> float | None:
        return self._server_cpu() if self._server_cpu is not None else None


def workers_advice(workers: int, cores: int, instead: str) -> str:
    """What to do when a process sending load is the limit: more processes (``--workers``,
    batch and sweep) while cores are left, else ``instead``."""
    more = min(cores, workers * 2)
    if more > workers:
        return f"split the load over {more} processes with --workers {more}, or {instead}"
    return (
        f"--workers {workers} already uses every core of this machine: {instead}, "
        "or run on more or faster cores"
    )


def _describe(cause: str, advice: str) -> str:
    cause_text = cause.replace("calibrate's", "its", 1)
    return (
        f"calibrate itself is the bottleneck: {cause_text}, so requests are waiting on the client, "
        f"not the server; throughput now is the client's limit ({advice})"
    )


def tree_cpu(pids: Callable[[], Iterable[int]]) -> Callable[[], float]:
    """A CPU clock of this process and its children: its own CPU seconds, its reaped children's,
    and those of the live ``pids`` (read from /proc; where there is none, the live children are
    counted once reaped). Never runs backwards (a child between its death and its reaping)."""
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
    last = [0.0]

    def clock() -> float:
        t = os.times()
        total = time.process_time() + t.children_user + t.children_system
        for pid in pids():
            try:
                with open(f"/proc/{pid}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue  # gone, or no /proc
            total += (int(fields[11]) + int(fields[12])) * tick_s  # utime, stime
        last[0] = max(last[0], total)
        return last[0]

    return clock

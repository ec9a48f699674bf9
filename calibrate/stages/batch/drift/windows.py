"""What one window of a batch saw: its items, their latency and tokens, the server and the machine.

A window closes once it holds at least ``4 × C`` finished items and has lasted a twentieth of
the run so far, between 2 s (``batch --drift-window-s`` sets it, 0.5 s at least) and 60 s
(``window_due``). Fewer than 4 × C items measure the start and end of requests more than
their rate (the sweep asks the same of a level); about 20 windows over the run so far let a
200-item batch (a few seconds) tell one slow window from a lasting slowdown, and a
million-item batch (hours) writes a line a minute, not one a second, each long enough that a
pause or one slow answer does not make it slow.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Literal

from calibrate.load.items import percentile
from calibrate.stages.batch.plan import DRIFT_WINDOW_S

ITEMS_PER_SLOT = 4  # a window holds at least this many items per request in flight
SHARE_OF_RUN = 20  # … and lasts about this fraction of the run so far
MIN_WINDOW_S = DRIFT_WINDOW_S  # the shortest a window lasts, unless --drift-window-s says
MAX_WINDOW_S = 60.0
SAMPLES = 4096  # latencies kept per window for its percentiles (a uniform sample past that)
# failures that are no failing of the server: the answer came, and failed the user's own check
# of what the prompt made (--expect json), or calibrate's own code failed (its bug, said so)
NOT_THE_SERVERS = frozenset({"format", "internal"})

# why a window is left out and ends a run of windows: the server was down in it (an outage: the
# breaker opened, or the watch's own scrape of /metrics found nothing listening), or another
# process of it began in it (``batch --restart``, or its /metrics counters began again from 0) —
# its numbers are the outage's, and the windows either side of it may be two servers (a server
# that is back from an outage may be another process: cold caches, maybe another setting)
LeftOut = Literal["outage", "restart"]
LEFT_OUT: dict[LeftOut, str] = {
    "outage": "the server was down in it (an outage)",
    "restart": "the server restarted in it (another process)",
}


def window_due(
    items: int, seconds: float, run_s: float, concurrency: int, shortest_s: float = MIN_WINDOW_S
) -> bool:
    """Whether a window of ``items`` finished over ``seconds`` closes now, ``run_s`` into the
    run (from its first finished item) at ``concurrency`` in flight, lasting ``shortest_s`` at
    least."""
    wanted_s = min(MAX_WINDOW_S, max(shortest_s, run_s / SHARE_OF_RUN))
    return items >= ITEMS_PER_SLOT * max(concurrency, 1) and seconds >= wanted_s


@dataclass(frozen=True)
class ServerSeen:
    """The server's own account over a window (its /metrics; None: it publishes none)."""

    preemptions: float | None = None  # the counter's rise since the batch began
    kv_usage_max: float | None = None  # 0–1
    running_max: float | None = None
    queue_max: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 4) if v is not None else None for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Window:
    """One closed window of the watched endpoint's finished items (``start_s`` from the run's
    first); ``judged`` False when it cannot speak for the server: it held an outage or a
    restart (``left_out``: no run of windows spans it), or the run was ending with fewer than C
    in flight."""

    index: int
    start_s: float
    seconds: float
    items: int
    errors: int
    kinds: tuple[tuple[str, int], ...] = ()
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    finished: int = 0  # items of the whole run finished by its end
    first_item: int = 1  # the run's count of finished items when it began, plus one
    judged: bool = True
    why_not: str = ""
    left_out: LeftOut | None = None
    server: ServerSeen | None = None
    others_cores: float | None = None  # other processes' CPU on this machine, in cores
    steal_share: float | None = None
    client_lag_s: float | None = None  # calibrate's threads: how late they ran, on average

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def error_rate(self) -> float:
        return self.errors / self.items if self.items else 0.0

    @property
    def kinds_text(self) -> str:
        return ", ".join(f"{k}×{n}" for k, n in self.kinds)

    def to_json(self) -> dict[str, Any]:
        def r(value: float | None, digits: int = 4) -> float | None:
            return round(value, digits) if value is not None else None

        return {
            "window": self.index,
            "start_s": round(self.start_s, 3),
            "seconds": round(self.seconds, 3),
            "items": self.items,
            "items_per_s": round(self.items_per_s, 3),
            "errors": self.errors,
            "error_kinds": dict(self.kinds),
            "latency_p50_s": r(self.latency_p50_s),
            "latency_p99_s": r(self.latency_p99_s),
            "input_tokens_mean": r(self.input_tokens_mean, 1),
            "output_tokens_mean": r(self.output_tokens_mean, 1),
            "first_item": self.first_item,
            "finished": self.finished,
            "judged": self.judged,
            "why_not": self.why_not or None,
            "left_out": self.left_out,
            "server": self.server.to_json() if self.server else None,
            "noise_other_cpu_cores": r(self.others_cores, 3),
            "noise_steal_share": r(self.steal_share),
            "noise_client_lag_s": r(self.client_lag_s),
        }


class Gathering:
    """The window being filled: one line at a time from the journal's thread (``add``), closed
    by the watch's (``close``); the caller holds the lock between them."""

    def __init__(self, started_s: float, first_item: int = 1, seed: int = 0) -> None:
        self.started_s = started_s
        self.first_item = first_item
        self.items = self.errors = 0
        self.kinds: Counter[str] = Counter()
        self.latencies: list[float] = []
        self._seen_ok = 0
        self._tokens_in = self._tokens_out = 0
        self._counted_in = self._counted_out = 0
        self._rng = random.Random(seed)
        self.left_out: LeftOut | None = None

    def leave_out(self, why: LeftOut) -> None:
        """The server was down, or restarted, while this window gathered (a restart says more)."""
        if self.left_out != "restart":
            self.left_out = why

    def add(self, line: dict[str, Any]) -> None:
        """One finished item's output line; an answer that failed a check of calibrate's own
        (``NOT_THE_SERVERS``) counts as the answer it is."""
        self.items += 1
        if line.get("ok") is not True:
            error = line.get("error")
            kind = str(error.get("kind")) if isinstance(error, dict) else "unknown"
            if kind not in NOT_THE_SERVERS:
                self.errors += 1
                self.kinds[kind] += 1
                return
        seconds = line.get("seconds")
        if isinstance(seconds, int | float) and seconds >= 0:
            self._seen_ok += 1
            if len(self.latencies) < SAMPLES:
                self.latencies.append(float(seconds))
            elif (at := self._rng.randrange(self._seen_ok)) < SAMPLES:  # reservoir sample
                self.latencies[at] = float(seconds)
        usage = line.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and prompt >= 0:
                self._tokens_in += prompt
                self._counted_in += 1
            if isinstance(completion, int) and completion >= 0:
                self._tokens_out += completion
                self._counted_out += 1

    def close(self, index: int, run_start_s: float, now_s: float, finished: int) -> Window:
        """The window as it stands at ``now_s`` (its server and noise are added by the watch)."""
        latencies = self.latencies
        return Window(
            index,
            self.started_s - run_start_s,
            now_s - self.started_s,
            self.items,
            self.errors,
            tuple(sorted(self.kinds.items())),
            percentile(latencies, 50),
            percentile(latencies, 99),
            self._tokens_in / self._counted_in if self._counted_in else None,
            self._tokens_out / self._counted_out if self._counted_out else None,
            finished,
            self.first_item,
            judged=self.left_out is None,
            why_not=LEFT_OUT[self.left_out] if self.left_out else "",
            left_out=self.left_out,
        )

"""When a request happened: sent, first token, finished (SPEC §4.1, §12).

One monotonic clock (``time.perf_counter``, the client's and the load engine's) anchored once,
at import, to wall time: ``epoch_at(reading)`` turns a reading of it into epoch seconds. Every
request of a run is placed on that one line, so times of different requests compare to the
microsecond, and a wall-clock step (NTP) in the middle of a run moves none of them. ``ts`` of a
record stays the time its line was written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

monotonic = time.perf_counter
_WALL_AT_START = time.time()
_MONO_AT_START = monotonic()


def epoch_at(reading: float) -> float:
    """The epoch seconds of a ``monotonic()`` reading."""
    return _WALL_AT_START + (reading - _MONO_AT_START)


def anchor() -> tuple[float, float]:
    """This process's wall time and clock reading at import: what ``epoch_at`` counts from."""
    return _WALL_AT_START, _MONO_AT_START


def use_anchor(wall: float, mono: float) -> None:
    """Count from another process's anchor (a load worker takes its parent's): the clock is
    CLOCK_MONOTONIC, one for the machine, so both then stamp every request on one line."""
    global _WALL_AT_START, _MONO_AT_START
    _WALL_AT_START, _MONO_AT_START = wall, mono


def _us(value: float | None) -> float | None:
    return round(value, 6) if value is not None else None


@dataclass(frozen=True)
class RequestTimes:
    """Epoch seconds on the one clock; ``first_token_at`` only for a streamed answer."""

    sent_at: float
    finished_at: float
    first_token_at: float | None = None

    @classmethod
    def of(cls, sent: float, finished: float, ttft_s: float | None = None) -> RequestTimes:
        """From two ``monotonic()`` readings and the time to the first token after ``sent``."""
        start = epoch_at(sent)
        first = start + ttft_s if ttft_s is not None else None
        return cls(start, epoch_at(finished), first)

    @property
    def elapsed_s(self) -> float:
        return self.finished_at - self.sent_at

    def to_json(self) -> dict[str, Any]:
        return {
            "sent_at": _us(self.sent_at),
            "first_token_at": _us(self.first_token_at),
            "finished_at": _us(self.finished_at),
        }


NO_TIMES: dict[str, Any] = {"sent_at": None, "first_token_at": None, "finished_at": None}

"""How many processes send a load (``--workers``, SPEC §12): one rule for the ladder's waves,
the sweep's loops and batch's items, read by their flags' help too."""

from __future__ import annotations

import math
import os

SLOTS_PER_WORKER = 32  # --workers auto: one process per this many in flight (as batch's)
RATE_PER_WORKER = 500.0  # … or per this many requests/s offered


def cores() -> int:
    """The cores this process may run on (``--workers auto`` takes at most these)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def workers_for(asked: int | None, in_flight: int, rate: float | None = None) -> int:
    """How many processes send a load of at most ``in_flight`` requests at once (and, open
    loop, ``rate`` req/s at most; inf: as fast as can be): ``asked``, or for auto (None) one
    per ``SLOTS_PER_WORKER`` in flight or per ``RATE_PER_WORKER`` req/s, whichever asks more —
    a process sends about that much before its one core is the limit (docs/stages.md) — and
    never more than the cores, nor more than the requests ever in flight."""
    if asked is None:
        by_rate = 0 if rate is None else cores() if math.isinf(rate) else rate / RATE_PER_WORKER
        wanted = max(1, math.ceil(in_flight / SLOTS_PER_WORKER), math.ceil(by_rate))
        asked = min(cores(), wanted)
    return max(1, min(asked, max(1, in_flight)))

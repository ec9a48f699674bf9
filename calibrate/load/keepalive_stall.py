"""Stalls at a keep-alive timeout, named from a level's latencies (SPEC §5.8): pure, no I/O.

llama.cpp serves HTTP from a small thread pool (``--threads-http``, by default a few threads
more than ``--parallel``). A kept-alive idle connection holds its thread until the server's
keep-alive timeout (5 s) runs out, so with more clients than threads some requests wait the
whole timeout before they are even read: most answers come in a tenth of a second and a few in
about 5 s (measured: 16 keep-alive clients against ``--parallel 4``, max 6.3 s; with
``--threads-http 20`` max 0.43 s). This finds that shape: a cluster of latencies just above
the timeout, far above the median, with few between the body and the cluster (a long tail is
load, not a stall).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

KEEPALIVE_TIMEOUT_S = 5.0  # llama.cpp's (cpp-httplib's) default keep-alive timeout
MIN_STALLS = 2  # one slow request is not a pattern
MEDIAN_FRACTION = 0.2  # the median must be under a fifth of the timeout to tell a stall apart


@dataclass(frozen=True)
class Stall:
    """``count`` of ``requests`` answered near ``timeout_s`` (typically ``typical_s``) while the
    median was ``median_s``."""

    count: int
    requests: int
    typical_s: float
    median_s: float
    timeout_s: float

    def text(self, concurrency: int, engine: str = "", threads_flag: str | None = None) -> str:
        """The note; ``threads_flag`` names the flag that sizes ``engine``'s HTTP threads, where
        the engine is known to have one (llama.cpp's --threads-http)."""
        threads = concurrency + 2
        where = (
            f"concurrency {concurrency}: {self.count} of {self.requests} requests took "
            f"≈{self.typical_s:.1f} s while the median was {self.median_s:.2f} s"
        )
        if threads_flag:
            cause = (
                f"stalls of ≈{self.timeout_s:g} s: {engine}'s HTTP threads are held by "
                f"kept-alive connections — start it with {threads_flag} {threads}"
            )
        else:
            cause = (
                f"stalls of ≈{self.timeout_s:g} s, a keep-alive timeout: the server's HTTP "
                "threads are likely held by kept-alive connections (llama.cpp: start it with "
                f"--threads-http {threads})"
            )
        return f"{where} — {cause}"


def find_stall(
    latencies_s: Sequence[float], timeout_s: float = KEEPALIVE_TIMEOUT_S
) -> Stall | None:
    """The stall cluster in one level's successful latencies, or None when there is none.

    A stall is a latency in [0.9×timeout, 1.4×timeout + 2×median] — the wait plus the request's
    own time under load. It counts when there are at least ``MIN_STALLS`` of them, the median is under a
    fifth of the timeout, and the stalls outnumber the latencies from half the timeout up to the
    cluster (a cluster, not a long tail)."""
    if len(latencies_s) < MIN_STALLS:
        return None
    median = statistics.median(latencies_s)
    if median <= 0 or median >= MEDIAN_FRACTION * timeout_s:
        return None
    low, high = 0.9 * timeout_s, 1.4 * timeout_s + 2 * median
    stalled = sorted(x for x in latencies_s if low <= x <= high)
    between = [x for x in latencies_s if timeout_s / 2 <= x < low]
    if len(stalled) < MIN_STALLS or len(between) >= len(stalled):
        return None
    return Stall(len(stalled), len(latencies_s), statistics.median(stalled), median, timeout_s)

"""When an open-loop run sends each request (SPEC §5.13): the schedule, as pure arithmetic.

``constant`` spaces requests exactly 1/rate apart; ``poisson`` draws exponential gaps (seeded);
``burstiness`` k draws gamma gaps of shape k and mean 1/rate instead (k = 1 is Poisson, k < 1
burstier, k > 1 smoother). A random schedule is rescaled so that its gaps average exactly
1/rate: the load offered over the run is the rate asked for, and only its shape is random —
so achieved-vs-offered compares the server with the schedule, not with the dice.
``inf`` sends everything at once. ``job`` follows a replayed batch's own gaps between sends (its
journal's ``sent_at``, in order, from the seed's place on), rescaled the same way: the job's
pattern — its bursts and lulls — at the rate asked for.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

from calibrate.errors import UsageError

Arrival = Literal["constant", "poisson", "job"]
ARRIVALS: tuple[Arrival, ...] = ("poisson", "constant", "job")
MIN_REQUESTS_PER_RATE = 8  # a rate level sends at least this many requests


def arrival_times(
    rate: float,
    count: int,
    *,
    arrival: Arrival = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    job_gaps: Sequence[float] = (),
) -> tuple[float, ...]:
    """``count`` send times in seconds from the start, the first at 0 (``job``: from the
    job's own ``job_gaps``, which must not be empty)."""
    if count <= 0:
        return ()
    if math.isinf(rate):
        return (0.0,) * count
    if arrival == "constant":
        return tuple(n / rate for n in range(count))
    if arrival == "job":
        if not job_gaps:
            raise ValueError("arrival 'job' needs the job's gaps (a replayed journal's)")
        gaps = [job_gaps[(seed + n) % len(job_gaps)] for n in range(count - 1)]
        if sum(gaps) <= 0:  # every one sent at once, as a batch's workers do: no pattern
            return tuple(n / rate for n in range(count))
    else:
        rng = random.Random(seed)
        gaps = [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(count - 1)]
    scale = (len(gaps) / rate) / sum(gaps) if gaps and sum(gaps) > 0 else 1.0
    out = [0.0]
    for gap in gaps:
        out.append(out[-1] + gap * scale)
    return tuple(out)


def requests_for(rate: float, level_s: float, cap: int) -> int:
    """How many requests a rate level sends: rate × level_s (inf: 4 × the in-flight cap)."""
    if math.isinf(rate):
        return max(MIN_REQUESTS_PER_RATE, 4 * cap)
    return max(MIN_REQUESTS_PER_RATE, math.ceil(rate * level_s))


def parse_rates(text: str) -> tuple[float, ...]:
    """``1,2,4,8,inf`` → rates in requests/s, rising."""
    rates: list[float] = []
    for part in text.split(","):
        try:
            rate = float(part.strip())
        except ValueError:
            rate = math.nan
        if math.isnan(rate) or rate <= 0:
            raise UsageError(
                f"--rates {text!r}: {part.strip()!r} is not a positive rate in requests/s",
                "Give rising rates, e.g. --rates 1,2,4,8,inf",
            )
        rates.append(rate)
    if rates != sorted(set(rates)):
        raise UsageError(f"--rates {text!r} must rise, each rate once", "e.g. --rates 1,2,4,8,inf")
    return tuple(rates)


def parse_counts(text: str) -> tuple[int, ...]:
    """``1,2,4`` → concurrency levels."""
    try:
        levels = tuple(int(p) for p in text.split(","))
    except ValueError:
        levels = ()
    if not levels or any(c < 1 for c in levels):
        raise UsageError(
            f"--concurrency {text!r} is not a list of whole numbers ≥ 1", "e.g. --concurrency 1,2,4"
        )
    # the knee is the first level within noise of the best as the levels rise: out of order,
    # "8,4,2,1" would name 8 the knee, sure ([sweep] concurrency refuses it too)
    if list(levels) != sorted(set(levels)):
        rising = ",".join(map(str, sorted(set(levels))))
        raise UsageError(
            f"--concurrency {text!r} must rise, each level once", f"e.g. --concurrency {rising}"
        )
    return levels


def rate_text(rate: float | None) -> str:
    return "inf" if rate is None or math.isinf(rate) else f"{rate:g}"


def rate_value(rate: float | None) -> float | str:
    """An offered rate as JSON and CSV hold it: the number, or ``"inf"`` (JSON has no infinity;
    pandas and ``float()`` read ``"inf"`` back as infinity)."""
    return "inf" if rate is None or math.isinf(rate) else rate

"""One reading of a value from JSON, CSV or a record as a number."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite int or float (not a bool); None otherwise —
    a missing cell, text, NaN, or an infinity (an offered rate of "inf" is a level's key,
    ``tier_table.level_key``, never a measurement)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def rate_text(value: float, fmt: str) -> str:
    """A rate (items/s, tokens/s, req/s) in ``fmt`` — but one that ``fmt`` would round to zero,
    a slow server's 0.004 items/s as "0.00", in two significant digits ("0.0041"): a server
    that answers slowly is slow, not stopped."""
    text = format(value, fmt)
    if not math.isfinite(value) or value <= 0 or any(c in "123456789" for c in text):
        return text  # shown as not zero ("1,234.5", "1e-05" too): as it is
    return f"{value:.{1 - math.floor(math.log10(value))}f}"


def clock_text(seconds: float) -> str:
    """A duration as a clock reads it: "0:42", "12:05", and from an hour on "1:30:00" (a long
    batch's time left, never "5400 s"); what a progress bar's ETA says, in a log too."""
    minutes, secs = divmod(max(int(seconds + 0.5), 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def seconds_text(value: float) -> str:
    """A few seconds as a line says them: whole ones from ten ("14"), one decimal from one
    ("2.6"), two significant digits below ("0.043"): a fast answer is never "0.0 s"."""
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"

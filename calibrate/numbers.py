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

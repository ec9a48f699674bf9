"""The one reader of ``tiers.csv`` (the table a ladder or sweep writes through ``report``).

``report RUN`` and ``--compare`` both read tables here, so a table one of them accepts the other
does too. Plain ``csv`` is enough to read it back (numbers parsed, empty cells as None); pandas
stays where the table is written.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from calibrate.errors import InputError

Kind = Literal["ladder", "sweep"]

REQUIRED: dict[str, tuple[str, ...]] = {
    "ladder": ("batch_size", "concurrency", "rounds", "items", "errors", "verdict"),
    "sweep": ("concurrency", "batch_size", "items", "verdict"),
}


def _cell(text: str) -> Any:
    """``"4"`` → 4, ``"0.25"`` → 0.25, ``""`` → None, anything else stays text."""
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    if math.isinf(number):
        return text  # "inf": an offered rate of everything at once, read by level_key
    return None if math.isnan(number) else number


def level_key(row: Mapping[str, Any], key: str) -> float | None:
    """The value that names a tier or level (batch size, concurrency, offered rate, auto step);
    an offered rate of ``"inf"`` is infinity. None when the row has none."""
    value = row.get(key)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return None if math.isnan(value) else float(value)
        except OverflowError:  # an integer of hundreds of digits (a damaged file): no tier
            return None
    return math.inf if isinstance(value, str) and value.strip().lower() == "inf" else None


# Request latency was once written as per_item_*; per_item_s now means wall time / items.
OLD_NAMES = {f"per_item_{q}_s": f"latency_{q}_s" for q in ("mean", "p50", "p90", "p99", "max")}


def upgraded(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of a table written before the rename, under today's column names."""
    out = dict(row)
    for old, new in OLD_NAMES.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
    return out


def read_rows(csv_path: Path) -> list[dict[str, Any]]:
    """The rows of a tiers.csv with typed cells (old column names upgraded); unreadable or empty
    is exit 2."""
    try:
        with csv_path.open(newline="", encoding="utf-8") as handle:
            raw = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputError(
            f"cannot read {csv_path}: {exc}",
            "Give a ladder or sweep run folder, e.g. runs/<run_id>",
        ) from exc
    if not raw:
        raise InputError(f"{csv_path} has no rows")
    return [
        upgraded({str(k): _cell(v or "") for k, v in row.items() if k is not None}) for row in raw
    ]


def check_rows(rows: Sequence[Mapping[str, Any]], kind: Kind, csv_path: Path) -> None:
    """Exit 2 on a table this tool did not write: missing columns or non-numbers in them."""
    missing = [c for c in REQUIRED[kind] if c not in rows[0]]
    if missing:
        raise InputError(
            f"{csv_path} is not a {kind} tier table: no column {', '.join(missing)}",
            f"A table written by calibrate {kind} is needed; rerun that stage.",
        )
    for number, row in enumerate(rows, 2):
        for column in REQUIRED[kind]:
            value = row.get(column)
            if column == "verdict":
                ok = isinstance(value, str)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                ok = math.isfinite(value)
            else:
                ok = False
            if not ok:
                raise InputError(
                    f"{csv_path}:{number}: {column} is {value!r}, not what a {kind} writes",
                    "Rerun the stage to write the table again.",
                )

"""What one cell holds, read from a CSV line's text or a JSONL line's value: a number, a count,
text, a flag, error kinds, per-device figures (``PARSERS``, by the type of the field it fills),
or — for a column this version does not know — whatever the text looks like (``guess``). A cell
that is not what its column holds is a ``CellError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from calibrate import json_text
from calibrate.io.tier_table.row import Device


class CellError(ValueError):
    """A cell that is not what its column holds."""

    def __init__(self, column: str, value: Any) -> None:
        super().__init__(f"{column} is {value!r}")
        self.column = column
        self.value = value


def cell_number(value: Any) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(value)
    number = float(value)  # "inf" is an offered rate of everything at once
    return None if math.isnan(number) else number


def cell_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value)
    number = cell_number(value)  # "4.0": a count in a column pandas once wrote as floats
    if number is None:
        return None
    if not number.is_integer():
        raise ValueError(value)
    return int(number)


def cell_text(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, dict | list):
        raise ValueError(value)
    return str(value)


def cell_flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if value is None or value == "":
        return None
    word = str(value).strip().lower()
    if word in ("true", "false"):
        return word == "true"
    raise ValueError(value)


def _kinds(value: Any) -> dict[str, int]:
    """``{"oom": 2}`` (JSONL) or ``oom:2 timeout:1`` (CSV)."""
    if value is None or value == "":
        return {}
    if isinstance(value, Mapping):
        return {str(k): int(n) for k, n in value.items()}
    pairs = [part.rsplit(":", 1) for part in str(value).split()]
    return {kind: int(n) for kind, n in pairs}


def _devices(value: Any) -> tuple[Device, ...]:
    """Per-device figures: a list (JSONL) or the same list as JSON text in one CSV cell."""
    if value is None or value == "":
        return ()
    found = json_text.loads(value) if isinstance(value, str) else value
    if not isinstance(found, list):
        raise ValueError(value)
    return tuple(
        Device(
            str(d["device"]),
            cell_number(d.get("used_mib")),
            cell_number(d.get("total_mib")),
            cell_number(d.get("pressure")),
        )
        for d in found
    )


PARSERS: dict[Any, Callable[[Any], Any]] = {
    int | None: cell_int,
    float | None: cell_number,
    str | None: cell_text,
    bool | None: cell_flag,
    Mapping[str, int]: _kinds,
    tuple[Device, ...]: _devices,
}


def guess(text: str) -> Any:
    """A CSV cell of a column this version does not know: ``"4"`` → 4, ``"0.25"`` → 0.25,
    ``""`` → None, anything else stays text."""
    if text == "":
        return None
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        if isinstance(number, float) and not math.isfinite(number):
            return None if math.isnan(number) else text
        return number
    return text

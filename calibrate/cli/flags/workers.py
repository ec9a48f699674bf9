"""``--workers N|auto``: how many processes send a command's load (batch, sweep; SPEC §12)."""

from __future__ import annotations

import argparse

MAX_WORKERS = 256


def workers_count(text: str) -> int | None:
    """--workers N (1…MAX_WORKERS) or auto (None)."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {text!r}") from None
    if not 1 <= value <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"must be 1…{MAX_WORKERS} or auto, got {value}")
    return value

"""The windows a tune's candidates were measured over, said where two figures are set side by
side. A halving search measures every candidate at a short window, then the better half again
at twice it: its ranked table holds rows of several windows, a longer one ranked first whatever
the figures, and a figure over 0.5× the window is not like for like with one over 1×."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def window_text(window: float) -> str:
    """``0.5×`` (of the sweep's level window); ``—`` for a row that did not say."""
    return f"{window:g}×" if window > 0 else "—"


def mixed(windows: Iterable[float]) -> bool:
    """True when the rows were measured over more than one window."""
    return len({w for w in windows if w > 0}) > 1


def across(winner: float, runner_up: float) -> str:
    """What follows the winner's margin over a runner-up measured over another window (``""``
    when the windows are the same, or not known)."""
    if winner <= 0 or runner_up <= 0 or winner == runner_up:
        return ""
    return (
        f" — the runner-up was measured over {window_text(runner_up)} the window, the winner "
        f"over {window_text(winner)}: not like for like"
    )


def note(rows: Sequence[tuple[str, float]]) -> str | None:
    """Under a table whose rows (id, window) mix windows: ``windows differ: c01 over 0.5×;
    c02, c03 over 1× the sweep's window; a longer window … ranks first whatever the figures,
    …``; None when they do not."""
    if not mixed(w for _, w in rows):
        return None
    by_window: dict[float, list[str]] = {}
    for ident, window in rows:
        if window > 0:
            by_window.setdefault(window, []).append(ident)
    said = [f"{', '.join(ids)} over {window_text(w)}" for w, ids in sorted(by_window.items())]
    return (
        f"windows differ: {'; '.join(said)} the sweep's window; a longer window (a later halving "
        "rung) ranks first whatever the figures, and rows of two windows are not like for like"
    )

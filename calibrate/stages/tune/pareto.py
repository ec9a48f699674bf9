"""A tune's Pareto front, and why ``pin`` takes the point it takes.

Each candidate that served a passing level is one point at that (its best) level: the goodput per
user — output tokens/s each request in flight gets, the level's output tokens/s over its
concurrency — against the total goodput — the output tokens/s of the requests that met every SLO
(the level's output tokens/s × goodput / items). A point is on the front when no other point has
as much of both and more of one. J/token and $/1M tokens ride along where they were measured
(``--rank-by`` ranks by them; they do not shape the front). The pinned point is the winner, the
one the ranking put first; ``reason`` says which ranking and what made it first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from calibrate.gpu.energy import RankBy
from calibrate.io.tier_table.tune import Point
from calibrate.io.tier_table.windows import window_text
from calibrate.stages.tune.result import CandidateResult

_WHY = {  # the first line of tune says "ranked by …" once; the reason says what that took
    "goodput": "the most requests/s within the SLOs (--rank-by goodput)",
    "joules_per_token": "the fewest joules per output token at its best level "
    "(--rank-by joules_per_token)",
    "usd_per_1m": "the fewest $ per 1M output tokens at its best level (--rank-by usd_per_1m)",
}


def _point(result: CandidateResult, pinned: bool) -> Point | None:
    best = result.best
    if best is None or result.crashed or best.goodput_per_s <= 0:
        return None
    share = best.goodput_per_s / best.items_per_s if best.items_per_s > 0 else 1.0
    return Point(
        result.candidate.id,
        result.candidate.describe(),
        best.concurrency,
        best.output_tokens_per_s / max(best.concurrency, 1),
        best.output_tokens_per_s * min(share, 1.0),
        best.goodput_per_s,
        best.joules_per_output_token,
        best.usd_per_1m_output_tokens,
        pinned=pinned,
        window=result.window,
    )


def points(ranked: Sequence[CandidateResult], pinned: str | None) -> list[Point]:
    """Every candidate that served a passing level, the front's first, each by total goodput
    (most first); ``pinned``: the id of the winner."""
    found = [p for r in ranked if (p := _point(r, r.candidate.id == pinned)) is not None]
    marked = [replace(p, on_front=not any(p.dominated_by(q) for q in found)) for p in found]
    return sorted(marked, key=lambda p: (not p.on_front, -p.total_tokens_per_s, p.id))


def reason(
    pinned: Point | None,
    rank_by: RankBy,
    front: Sequence[Point],
    conservative: str = "",
    *,
    same_cap: bool = False,
    slos: bool = False,
) -> str:
    """Why pin takes ``pinned``: the ranking, and whether it is on the front (and if not,
    which front points give more of both). ``conservative``: taken under noise, the smaller
    cap of the two — or, when the two run at the ``same_cap``, the first-ranked."""
    if pinned is None:
        return ""
    why = _WHY.get(rank_by, f"the best by {rank_by} (--rank-by {rank_by})")
    if rank_by == "goodput" and not slos:  # no SLO to be within: every ok answer counts
        why = "the most requests/s, every answer counted: no SLOs set (--rank-by goodput)"
    if conservative:
        which = (
            "the first-ranked of the two (neither has the smaller cap)"
            if same_cap
            else "the smaller cap of the two"
        )
        why = f"taken under noise (--conservative): {conservative}, {which}"
    head = (
        f"pin takes {pinned.id} ({pinned.flags}) at concurrency {pinned.concurrency}: {why}; "
        f"{pinned.per_user_tokens_per_s:.1f} tokens/s per user, "
        f"{pinned.total_tokens_per_s:.1f} tokens/s in all"
    )
    if pinned.on_front:
        return head + ", on the Pareto front"
    better = [_beaten_by(p, pinned) for p in front if p.on_front and pinned.dominated_by(p)]
    return head + f", off the Pareto front (beaten on both axes by {', '.join(better)})"


def _beaten_by(point: Point, pinned: Point) -> str:
    """``c01``, or ``c01 (over 0.5× the window, c02 over 1×: not like for like)``."""
    if point.window <= 0 or pinned.window <= 0 or point.window == pinned.window:
        return point.id
    return (
        f"{point.id} (over {window_text(point.window)} the window, {pinned.id} over "
        f"{window_text(pinned.window)}: not like for like)"
    )

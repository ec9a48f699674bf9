"""A tune's ranked candidates as one table: the same cells on a terminal (the essential
columns, fitting the width; --wide: every one), in a log, and in ``report RUN``'s HTML page;
and its Pareto front (goodput per user against total goodput) as a second one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.table import Table

from calibrate.io.tier_table.tune import Point, TuneRow
from calibrate.io.tier_table.windows import mixed, window_text
from calibrate.report.tables.cells import count, figure, rate
from calibrate.report.tables.grid import fit, grid
from calibrate.server.exit_status import ended_words

TuneCells = list[tuple[str, Callable[[TuneRow], str]]]


def _status(row: TuneRow) -> str:
    """``did not start (exit code 1)``, ``crashed (killed by SIGKILL)``: how its server ended."""
    code = row.start_exit_code if row.status == "did not start" else None
    if row.status == "crashed":
        code = row.exit_code
    return row.status + (f" ({ended_words(code)})" if code is not None else "")


COLUMNS: TuneCells = [
    ("rank", lambda r: str(r.rank)),
    ("id", lambda r: r.id),
    ("flags", lambda r: r.flags),
    ("status", _status),
    ("cap", lambda r: count(r.cap)),
    ("conc", lambda r: count(r.best_concurrency)),
    ("goodput/s", lambda r: figure(r.goodput_per_s, ".2f")),
    ("items/s", lambda r: rate(r.items_per_s, ".2f")),
    ("tok/s", lambda r: rate(r.output_tokens_per_s, ".0f")),
    ("p50 s", lambda r: figure(r.p50_s, ".3f")),
    ("p90 s", lambda r: figure(r.p90_s, ".3f")),
    ("J/tok", lambda r: figure(r.joules_per_output_token, ".3f")),
    ("$/1M tok", lambda r: figure(r.usd_per_1m_output_tokens, ".3f")),
    ("peak MiB", lambda r: figure(r.peak_vram_mib, ".0f")),
    ("KV", lambda r: figure(r.peak_kv_usage, ".0%")),
    ("errors", lambda r: str(r.errors)),
    ("incidents", lambda r: str(r.incidents)),
]

# On a narrow screen these go first, in this order (--wide keeps them all); J/tok and $/1M tok
# stay (--rank-by ranks by them), shown where energy (and a price) was measured at all.
_DROP_FIRST = ("incidents", "tok/s", "KV", "p90 s", "cap", "items/s", "status", "peak MiB")
_WHEN_MEASURED: dict[str, Callable[[TuneRow], float | None]] = {
    "J/tok": lambda r: r.joules_per_output_token,
    "$/1M tok": lambda r: r.usd_per_1m_output_tokens,
}
LEFT = ("id", "flags", "status")  # the text columns, left-aligned (the HTML page too)


def _style(n: int, row: TuneRow) -> str | None:
    """The winner in green; a candidate that did not start, serve or stay up in red."""
    if row.status in ("did not start", "did not serve", "crashed"):
        return "red"
    return "green" if n == 0 and row.goodput_per_s else None


def ranked_table(rows: Sequence[TuneRow], title: str | None, width: int | None = None) -> Table:
    """The ranked candidates; with ``width``, minor columns are left out until it fits."""
    return grid(
        fit(columns_of(rows), rows, width, _DROP_FIRST), rows, title, left=LEFT, style=_style
    )


def columns_of(rows: Sequence[TuneRow]) -> TuneCells:
    """Every column, but an energy or cost column no candidate has a figure for; and, after the
    rank, each row's window where the rows were measured over more than one (halving)."""
    found = [
        (name, cell)
        for name, cell in COLUMNS
        if name not in _WHEN_MEASURED or any(_WHEN_MEASURED[name](r) is not None for r in rows)
    ]
    if mixed(r.window for r in rows):
        found.insert(1, ("window", lambda r: window_text(r.window)))
    return found


# The Pareto front (``stages.tune.pareto``): the points on it and the pinned one, whatever it is.
FrontCells = list[tuple[str, Callable[[Point], str]]]
FRONT_COLUMNS: FrontCells = [
    ("id", lambda p: p.id),
    ("flags", lambda p: p.flags),
    ("conc", lambda p: str(p.concurrency)),
    ("tok/s per user", lambda p: figure(p.per_user_tokens_per_s, ".1f")),
    ("tok/s total", lambda p: figure(p.total_tokens_per_s, ".1f")),
    ("goodput/s", lambda p: figure(p.goodput_per_s, ".2f")),
    ("J/tok", lambda p: figure(p.joules_per_output_token, ".3f")),
    ("$/1M tok", lambda p: figure(p.usd_per_1m_output_tokens, ".3f")),
    ("", lambda p: ("pinned" if p.pinned else "") + ("" if p.on_front else " (off)")),
]
_FRONT_MEASURED: dict[str, Callable[[Point], float | None]] = {
    "J/tok": lambda p: p.joules_per_output_token,
    "$/1M tok": lambda p: p.usd_per_1m_output_tokens,
}
_FRONT_LEFT = ("id", "flags", "")


def front_rows(points: Sequence[Point]) -> list[Point]:
    """The points on the front, and the pinned one if it is not."""
    return [p for p in points if p.on_front or p.pinned]


def front_columns(rows: Sequence[Point]) -> FrontCells:
    """The front's columns, but an energy or cost column no point has a figure for; each
    point's window after its concurrency where the points were measured over more than one."""
    found = [
        (name, cell)
        for name, cell in FRONT_COLUMNS
        if name not in _FRONT_MEASURED or any(_FRONT_MEASURED[name](p) is not None for p in rows)
    ]
    if mixed(p.window for p in rows):
        found.insert(3, ("window", lambda p: window_text(p.window)))
    return found


def front_table(points: Sequence[Point], title: str | None, width: int | None = None) -> Table:
    """The Pareto front: goodput per user against total goodput, the pinned point in green."""
    rows = front_rows(points)
    columns = fit(front_columns(rows), rows, width, ("goodput/s", "conc"))
    return grid(
        columns,
        rows,
        title,
        left=_FRONT_LEFT,
        style=lambda n, point: "green" if point.pinned else None,
    )

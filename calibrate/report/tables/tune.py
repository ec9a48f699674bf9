"""A tune's ranked candidates as one table: the same cells on a terminal (the essential
columns, fitting the width; --wide: every one), in a log, and in ``report RUN``'s HTML page;
and its Pareto front (goodput per user against total goodput) as a second one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from calibrate.report.tables.cells import Cells, figure
from calibrate.report.tables.grid import fit, grid
from calibrate.server.exit_status import ended_words


def _status(row: Mapping[str, Any]) -> str:
    """``did not start (exit code 1)``, ``crashed (killed by SIGKILL)``: how its server ended."""
    code = row.get("start_exit_code") if row["status"] == "did not start" else None
    if row["status"] == "crashed":
        code = row.get("exit_code")
    return str(row["status"]) + (f" ({ended_words(code)})" if isinstance(code, int) else "")


def _count(value: Any) -> str:
    return "—" if value in (None, "") else str(value)


COLUMNS: Cells = [
    ("rank", lambda r: str(r["rank"])),
    ("id", lambda r: str(r["id"])),
    ("flags", lambda r: str(r["flags"])),
    ("status", lambda r: _status(r)),
    ("cap", lambda r: _count(r.get("cap"))),
    ("conc", lambda r: _count(r.get("best_concurrency"))),
    ("goodput/s", lambda r: figure(r.get("goodput_per_s"), ".2f")),
    ("items/s", lambda r: figure(r.get("items_per_s"), ".2f")),
    ("tok/s", lambda r: figure(r.get("output_tokens_per_s"), ".0f")),
    ("p50 s", lambda r: figure(r.get("p50_s"), ".3f")),
    ("p90 s", lambda r: figure(r.get("p90_s"), ".3f")),
    ("J/tok", lambda r: figure(r.get("joules_per_output_token"), ".3f")),
    ("$/1M tok", lambda r: figure(r.get("usd_per_1m_output_tokens"), ".3f")),
    ("peak MiB", lambda r: figure(r.get("peak_vram_mib"), ".0f")),
    ("KV", lambda r: figure(r.get("peak_kv_usage"), ".0%")),
    ("errors", lambda r: str(r["errors"])),
    ("incidents", lambda r: str(r["incidents"])),
]

# On a narrow screen these go first, in this order (--wide keeps them all); J/tok and $/1M tok
# stay (--rank-by ranks by them), shown where energy (and a price) was measured at all.
_DROP_FIRST = ("incidents", "tok/s", "KV", "p90 s", "cap", "items/s", "status")
_WHEN_MEASURED = {"J/tok": "joules_per_output_token", "$/1M tok": "usd_per_1m_output_tokens"}
LEFT = ("id", "flags", "status")  # the text columns, left-aligned (the HTML page too)


def _style(n: int, row: Mapping[str, Any]) -> str | None:
    """The winner in green; a candidate that did not start, serve or stay up in red."""
    if row["status"] in ("did not start", "did not serve", "crashed"):
        return "red"
    return "green" if n == 0 and row.get("goodput_per_s") else None


def ranked_table(
    rows: Sequence[Mapping[str, Any]], title: str | None, width: int | None = None
) -> Table:
    """The ranked candidates; with ``width``, minor columns are left out until it fits."""
    return grid(
        fit(columns_of(rows), rows, width, _DROP_FIRST), rows, title, left=LEFT, style=_style
    )


def columns_of(rows: Sequence[Mapping[str, Any]], columns: Cells = COLUMNS) -> Cells:
    """Every column of ``columns``, but an energy or cost column no row has a figure for."""
    return [
        (name, cell)
        for name, cell in columns
        if name not in _WHEN_MEASURED
        or any(r.get(_WHEN_MEASURED[name]) not in (None, "") for r in rows)
    ]


# The Pareto front (``stages.tune.pareto``): the points on it and the pinned one, whatever it is.
FRONT_COLUMNS: Cells = [
    ("id", lambda r: str(r["id"])),
    ("flags", lambda r: str(r["flags"])),
    ("conc", lambda r: _count(r.get("concurrency"))),
    ("tok/s per user", lambda r: figure(r.get("per_user_tokens_per_s"), ".1f")),
    ("tok/s total", lambda r: figure(r.get("total_tokens_per_s"), ".1f")),
    ("goodput/s", lambda r: figure(r.get("goodput_per_s"), ".2f")),
    ("J/tok", lambda r: figure(r.get("joules_per_output_token"), ".3f")),
    ("$/1M tok", lambda r: figure(r.get("usd_per_1m_output_tokens"), ".3f")),
    ("", lambda r: ("pinned" if r.get("pinned") else "") + ("" if r.get("on_front") else " (off)")),
]
_FRONT_LEFT = ("id", "flags", "")


def front_rows(points: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The points on the front, and the pinned one if it is not."""
    return [p for p in points if p.get("on_front") or p.get("pinned")]


def front_columns(rows: Sequence[Mapping[str, Any]]) -> Cells:
    """The front's columns, but an energy or cost column no point has a figure for."""
    return columns_of(rows, FRONT_COLUMNS)


def front_table(
    points: Sequence[Mapping[str, Any]], title: str | None, width: int | None = None
) -> Table:
    """The Pareto front: goodput per user against total goodput, the pinned point in green."""
    rows = front_rows(points)
    columns = fit(front_columns(rows), rows, width, ("goodput/s", "conc"))
    return grid(
        columns,
        rows,
        title,
        left=_FRONT_LEFT,
        style=lambda n, row: "green" if row.get("pinned") else None,
    )

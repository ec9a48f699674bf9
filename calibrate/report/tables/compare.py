"""Tables that set two results side by side: a run against its baseline (``--compare``) and
``report A B``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from calibrate.confidence import percent
from calibrate.io.tier_table.cells import numbers
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.row import TierRow
from calibrate.report.compare import RunComparison
from calibrate.report.tables.columns import short_name
from calibrate.report.tables.grid import compact, plain
from calibrate.stages.measure.tier_stage.compare_tiers import TierComparison


def compare_table(cmp: TierComparison) -> Table:
    """Baseline, now and change side by side; offending cells marked."""
    table = compact(f"compared with {cmp.baseline_path} (tolerance {cmp.tolerance:.0%})")
    for name in (
        cmp.key_name,
        "verdict: baseline",
        "now",
        f"{cmp.metric_name}: baseline",
        "now",
        "change",
    ):
        table.add_column(name)

    def mark(text: str, bad: bool) -> Text:
        return plain(f"{text} ✗", "bold red") if bad else plain(text)

    for row in cmp.rows:
        table.add_row(
            plain(f"{row.key:g}"),
            plain(row.verdict.baseline),
            mark(row.verdict.now, row.verdict.bad),
            plain(row.metric.baseline),
            mark(row.metric.now, row.metric.bad),
            plain(row.change),
        )
    table.add_row(
        "last passing",
        plain(cmp.last_passing.baseline),
        mark(cmp.last_passing.now, cmp.last_passing.bad),
        "",
        "",
        "",
    )
    return table


# The metrics the default ``report A B`` table shows first (a setting is picked on these);
# the others follow while the table fits. --wide: every one in the headline order.
_FIRST: tuple[str, ...] = (
    C.ITEMS_PER_S,
    C.ACHIEVED_RATE,
    C.GOODPUT_PER_S,
    C.LATENCY_P99_S,
    C.E2E_P99_S,
    C.TTFT_P99_S,
    C.PEAK_VRAM_MIB,
    C.ERRORS,
)


def _by_use(metrics: Sequence[str]) -> list[str]:
    return sorted(metrics, key=lambda m: _FIRST.index(m) if m in _FIRST else len(_FIRST))


def _short(value: float | None) -> str:
    """Three significant digits (the JSON and the HTML keep more): ``0.00823``, ``76.4``."""
    if value is None:
        return "—"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _pair_cell(delta: Any, side: TierRow, metric: str) -> tuple[str, str]:
    """``8 → 6 (-25%)`` and its colour; ``(+27%, significant)`` when tested over the rounds
    (the caption says at what level), ``(+27%, too few)`` for a percentile over too few
    requests a round (the caption says how many it needs)."""
    if delta is None:
        return _short(numbers(side).get(metric)), ""
    text = f"{_short(delta.a)} → {_short(delta.b)}"
    if delta.diff is not None:
        change = f"{delta.diff:+.4g}" if delta.change is None else f"{delta.change:+.0%}"
        if delta.diff and not delta.inside_noise:
            said = {True: ", significant", False: ", not significant", None: ", not tested"}
            change += ", too few" if _too_few(delta) else said[delta.significant]
        text += f" ({change})"
    colour = "" if delta.better is None else ("green" if delta.better else "red")
    return text, colour


def _too_few(delta: Any) -> bool:
    """A percentile whose rounds had too few requests (where the rounds say how many)."""
    return bool(delta.too_few and delta.samples is not None and delta.samples.known)


def _requests_said(cmp: RunComparison, metrics: Sequence[str]) -> list[str]:
    """``requests a round: A 1–4, B 1–4`` and, where a shown percentile had too few, what
    each needs: ``too few requests a round for a p50 (needs 2), a p99 (needs 100)``."""
    a, b = cmp.requests
    out = [f"requests a round: A {a or '?'}, B {b or '?'}"] if a or b else []
    needs = sorted(
        {
            (d.samples.needed, d.samples.name)
            for row in cmp.rows
            for m, d in row.deltas.items()
            if m in metrics and d.samples is not None and _too_few(d)
        }
    )
    if needs:
        said = ", ".join(f"a {name} (needs {n})" for n, name in needs)
        out.append(f"too few requests a round for {said}")
    return out


def runs_compare_table(cmp: RunComparison, width: int | None = 100, wide: bool = False) -> Table:
    """``report A B``: per tier, each headline metric as ``A → B (change)``; without ``wide``
    the metrics a setting is picked on come first and the rest are left out once the table
    would not fit ``width``."""
    metrics = list(cmp.metrics) if wide else _by_use(cmp.metrics)
    cells: list[list[tuple[str, str]]] = []
    for row in cmp.rows:
        line = [
            (f"{row.key:g}", ""),
            ((row.a and row.a.verdict) or "not run", ""),
            ((row.b and row.b.verdict) or "not run", ""),
        ]
        line += [_pair_cell(row.deltas.get(m), row.side, m) for m in metrics]
        cells.append(line)
    names = [short_name(cmp.key), "verdict A", "verdict B", *(short_name(m) for m in metrics)]
    widths = [max([len(n), *(len(c[i][0]) for c in cells)]) for i, n in enumerate(names)]
    shown = len(names)
    while (
        not wide and width is not None and shown > 4 and sum(widths[:shown]) + 2 * shown - 2 > width
    ):
        shown -= 1
    said = [
        f"significant at {percent(cmp.level)}"
        if any("significant" in text for line in cells for text, _ in line[3:shown])
        else "",
        "more metrics: --wide" if shown < len(names) else "",
    ]
    lines = ["; ".join(s for s in said if s), *_requests_said(cmp, metrics[: max(shown - 3, 0)])]
    table = compact(f"A = {cmp.a.run_id}   B = {cmp.b.run_id}")
    table.caption, table.caption_justify = "\n".join(s for s in lines if s) or None, "left"
    for name in names[:shown]:
        table.add_column(name, justify="left" if name.startswith("verdict") else "right")
    for line in cells:
        table.add_row(*(plain(text, colour) for text, colour in line[:shown]))
    return table

"""``calibrate report RUN_A RUN_B --html``: the comparison as one self-contained HTML file.

It leads with the answer, as the one-run report does: each run's verdict and setting side by
side, then the overlaid plots, the headline metrics as ``A → B (Δ)`` (every column folded under
them), and last, folded, which runs were compared.
"""

from __future__ import annotations

from calibrate.io.tier_table.cells import numbers
from calibrate.io.tier_table.columns import Column as C
from calibrate.report.compare import PairRow, RunComparison
from calibrate.report.delta import Delta, delta_text
from calibrate.report.html.answer import setting_tiles, verdict_word
from calibrate.report.html.charts import charts_pair, key_label
from calibrate.report.html.parts import (
    definitions,
    folded,
    page,
    section,
    table,
    text,
    verdict_class,
)
from calibrate.report.run_view import RunView
from calibrate.report.spreads import value_text


def _side(label: str, view: RunView) -> list[tuple[str, str]]:
    v = view.verdict
    word = verdict_word(v.passed)[0]
    return [
        (f"{label}", f"{view.run_id} ({view.path})"),
        (f"{label}: verdict", word),
        (f"{label}: stopped by", v.stopped_by),
        (f"{label}: last passing", v.last_passing),
    ]


def _verdicts(row: PairRow) -> tuple[str, str]:
    """Each run's verdict of the tier; ``not run`` where it has none."""
    return (row.a and row.a.verdict) or "not run", (row.b and row.b.verdict) or "not run"


def _values(row: PairRow, metric: str) -> tuple[str, str]:
    """A metric of one tier in A and in B, as text."""
    return (
        value_text(numbers(row.a).get(metric) if row.a else None),
        value_text(numbers(row.b).get(metric) if row.b else None),
    )


def _better_class(delta: Delta) -> str:
    """The ``class`` attribute of a change: green where B is better, red where worse."""
    if delta.better is None:
        return ""
    return ' class="better"' if delta.better else ' class="worse"'


def comparison_table(cmp: RunComparison) -> str:
    headers = [cmp.key, "verdict A", "verdict B"]
    for metric in cmp.metrics:
        headers += [f"{metric} A", f"{metric} B", f"{metric} Δ"]
    rows: list[list[str]] = []
    attrs: list[dict[str, str]] = []
    for row in cmp.rows:
        verdict_a, verdict_b = _verdicts(row)
        cells = [text(f"{row.key:g}"), text(verdict_a), text(verdict_b)]
        for metric in cmp.metrics:
            delta = row.deltas.get(metric)
            if delta is None:
                cells += [*map(text, _values(row, metric)), ""]
                continue
            klass = _better_class(delta)
            cells += [
                text(value_text(delta.a)),
                text(value_text(delta.b)),
                f"<span{klass}>{text(delta_text(delta))}</span>" if delta_text(delta) else "",
            ]
        rows.append(cells)
        attrs.append(
            {
                "class": f"tier {verdict_class(verdict_b if row.b else verdict_a)}",
                "data-key": f"{row.key:g}",
            }
        )
    return table(
        "comparison",
        headers,
        rows,
        row_attrs=attrs,
        text_columns=("verdict A", "verdict B"),
        raw=True,
    )


# The metrics shown by default, one column each (``A → B (Δ)``); the rest are folded.
SHORT_METRICS = (
    C.ITEMS_PER_S,
    C.ACHIEVED_RATE,
    C.GOODPUT_PER_S,
    C.OUTPUT_TOKENS_PER_S,
    C.LATENCY_P50_S,
    C.E2E_P50_S,
    C.LATENCY_P99_S,
    C.E2E_P99_S,
    C.TTFT_P50_S,
    C.PEAK_VRAM_MIB,
    C.ERRORS,
)


_LABELS: dict[str, str] = {
    C.ITEMS_PER_S: "items/s",
    C.ACHIEVED_RATE: "achieved req/s",
    C.GOODPUT_PER_S: "goodput req/s",
    C.OUTPUT_TOKENS_PER_S: "tok/s",
    C.LATENCY_P50_S: "p50 s",
    C.E2E_P50_S: "p50 s",
    C.LATENCY_P99_S: "p99 s",
    C.E2E_P99_S: "p99 s",
    C.TTFT_P50_S: "ttft p50 s",
    C.PEAK_VRAM_MIB: "peak MiB",
}


def _pair_cell(row: PairRow, metric: str) -> str:
    delta = row.deltas.get(metric)
    if delta is None:
        a, b = _values(row, metric)
        return text(f"{a} → {b}")
    said = delta_text(delta)
    change = f" <span{_better_class(delta)}>({text(said)})</span>" if said else ""
    return f"{text(value_text(delta.a))} → {text(value_text(delta.b))}{change}"


def summary_table(cmp: RunComparison) -> str:
    """The key, both verdicts and the headline metrics as ``A → B (Δ)``: fits 1280 px."""
    metrics = [m for m in cmp.metrics if m in SHORT_METRICS]
    rows: list[list[str]] = []
    attrs: list[dict[str, str]] = []
    for row in cmp.rows:
        verdict_a, verdict_b = _verdicts(row)
        rows.append(
            [text(f"{row.key:g}"), text(verdict_a), text(verdict_b)]
            + [_pair_cell(row, m) for m in metrics]
        )
        attrs.append({"class": f"tier {verdict_class(verdict_b if row.b else verdict_a)}"})
    return table(
        "comparison-summary",
        [key_label(cmp.key), "verdict A", "verdict B", *(_LABELS.get(m, m) for m in metrics)],
        rows,
        row_attrs=attrs,
        text_columns=("verdict A", "verdict B", *(_LABELS.get(m, m) for m in metrics)),
        raw=True,
    )


def _answer(label: str, view: RunView) -> str:
    word, klass = verdict_word(view.verdict.passed)
    side = label.lower()
    return (
        f'<div class="side" id="side-{side}"><h3>{text(label)}: {text(view.run_id)}</h3>'
        f'<p class="verdict {klass}" id="verdict-{side}">{text(word)}</p>'
        f"{setting_tiles(view, f'setting-{side}')}</div>"
    )


def _requests(cmp: RunComparison) -> list[str]:
    """How many requests each side's rounds had: a percentile is tested only over enough."""
    a, b = cmp.requests
    if not (a or b):
        return []
    return [
        f'<p id="requests-per-round">Requests a round: A {text(a or "not known")}, '
        f"B {text(b or 'not known')}; a p<i>Q</i> is tested only where every round had "
        "1 / (1 − Q) of them (a p99: 100).</p>"
    ]


def comparison_html(cmp: RunComparison) -> str:
    """Both runs' verdicts and settings, overlaid plots, the matched tiers with deltas, and
    which runs these are."""
    title = f"calibrate {cmp.kind}: {cmp.a.run_id} vs {cmp.b.run_id}"
    warning = (
        [f'<p class="unknown" id="not-like-for-like">warning: {text(cmp.warning)}</p>']
        if cmp.warning
        else []
    )
    return page(
        title,
        [
            f"<h1>{text(title)}</h1>",
            *warning,
            section(
                "verdict",
                "Verdicts",
                [f'<div class="sides">{_answer("A", cmp.a)}{_answer("B", cmp.b)}</div>'],
            ),
            section(
                "plots", "Plots", ['<div class="charts">', *charts_pair(cmp.a, cmp.b), "</div>"]
            ),
            section(
                "tier-table",
                "Tiers, A → B",
                [
                    "<p>Δ is B against A; green where B is better, red where it is worse.</p>",
                    *_requests(cmp),
                    summary_table(cmp),
                    folded(
                        "comparison-columns",
                        f"every metric as A, B and Δ ({len(cmp.metrics)} metrics)",
                        [comparison_table(cmp)],
                    ),
                ],
            ),
            section(
                "runs",
                "Runs",
                [
                    folded(
                        "run-pairs",
                        "the two run folders, their verdicts and where they stopped",
                        [definitions(_side("A", cmp.a) + _side("B", cmp.b), "run-pair")],
                    )
                ],
            ),
        ],
    )

"""``calibrate report RUN_A RUN_B --html``: the comparison as one self-contained HTML file."""

from __future__ import annotations

from calibrate.html_parts import definitions, page, section, table, text, verdict_class
from calibrate.html_report import charts_pair, verdict_word
from calibrate.numbers import finite
from calibrate.report_compare import RunComparison, delta_text, value_text
from calibrate.run_view import RunView


def _side(label: str, view: RunView) -> list[tuple[str, str]]:
    v = view.verdict
    word = verdict_word(v.passed)[0]
    return [
        (f"{label}", f"{view.run_id} ({view.path})"),
        (f"{label}: verdict", word),
        (f"{label}: stopped by", v.stopped_by),
        (f"{label}: last passing", v.last_passing),
    ]


def comparison_table(cmp: RunComparison) -> str:
    headers = [cmp.key, "verdict A", "verdict B"]
    for metric in cmp.metrics:
        headers += [f"{metric} A", f"{metric} B", f"{metric} Δ"]
    rows: list[list[str]] = []
    attrs: list[dict[str, str]] = []
    for row in cmp.rows:
        verdict_a = (row.a or {}).get("verdict") or "not run"
        verdict_b = (row.b or {}).get("verdict") or "not run"
        cells = [text(f"{row.key:g}"), text(verdict_a), text(verdict_b)]
        for metric in cmp.metrics:
            delta = row.deltas.get(metric)
            if delta is None:
                cells += [
                    text(value_text(finite((row.a or {}).get(metric)))),
                    text(value_text(finite((row.b or {}).get(metric)))),
                    "",
                ]
                continue
            klass = (
                ""
                if delta.better is None
                else (' class="better"' if delta.better else ' class="worse"')
            )
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


def comparison_html(cmp: RunComparison) -> str:
    """Both runs' verdicts, the matched tiers with deltas, and overlaid plots."""
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
                "runs", "Runs", [definitions(_side("A", cmp.a) + _side("B", cmp.b), "run-pair")]
            ),
            section(
                "tier-table",
                "Tiers, A → B",
                [
                    "<p>Δ is B against A; green where B is better, red where it is worse.</p>",
                    comparison_table(cmp),
                ],
            ),
            section(
                "plots", "Plots", ['<div class="charts">', *charts_pair(cmp.a, cmp.b), "</div>"]
            ),
        ],
    )

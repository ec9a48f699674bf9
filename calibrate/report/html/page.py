"""``calibrate report RUN --html``: one self-contained HTML file for a ladder or sweep run.

It leads with the answer: the verdict and the setting with its numbers (``html.answer``), then
the plots (latency vs throughput, throughput, VRAM, pressure; failed tiers crossed out), the
tier table (the essential columns; every column folded under it), the optional request
timeline, the incidents, and last, folded, the run's configuration. Plots are inline SVG from
``html.svg`` so the file needs neither matplotlib nor a network to be read.
"""

from __future__ import annotations

from calibrate.io.tier_table import read_row_lines
from calibrate.report.html.answer import verdict_html
from calibrate.report.html.charts import charts_for
from calibrate.report.html.configuration import configuration_html
from calibrate.report.html.parts import page, section, table, text
from calibrate.report.html.replay import replay_html
from calibrate.report.html.svg import timeline_chart
from calibrate.report.html.tiers import tier_table_html
from calibrate.report.replay import replay_fit
from calibrate.report.run_view import RunView
from calibrate.report.timeline import Timeline


def incidents_html(view: RunView) -> str:
    if not view.incidents:
        return section("incidents", "Incidents", ["<p>none</p>"])
    rows = [
        [i.file, i.kind, i.message, "" if i.status is None else str(i.status)]
        for i in view.incidents
    ]
    return section(
        "incidents",
        f"Incidents ({len(view.incidents)})",
        [
            table(
                "incident-list",
                ["file", "kind", "message", "status"],
                rows,
                text_columns=("file", "kind", "message"),
            ),
        ],
    )


def _variants(view: RunView) -> dict[str, tuple[str, str]]:
    """Per tier or level key, the two texts around the first difference (tiers.jsonl)."""
    found: dict[str, tuple[str, str]] = {}
    path = view.path / "tiers.jsonl"
    try:
        lines = list(read_row_lines(path)) if path.is_file() else []
    except OSError:
        return found
    for _, row in lines:
        key, copies = view.key_of(row), row.determinism
        if key is not None and copies.first_diff_common is not None:
            found[f"{key:g}"] = (copies.first_diff_common, str(copies.first_diff_variant))
    return found


def determinism_html(view: RunView) -> str | None:
    """SPEC §13: copies of the fixed prompt per tier or level; None when none were sent."""
    rows = [r for r in view.rows if r.determinism.distinct_completions is not None]
    if not rows:
        return None
    variants = _variants(view)
    cells = []
    for r in rows:
        value = view.key_of(r)
        key = "" if value is None else f"{value:g}"
        common, variant = variants.get(key, ("", ""))
        diff = r.determinism.first_diff_token
        distinct = r.determinism.distinct_completions
        cells.append([key, f"{distinct:g}", "" if diff is None else f"{diff:g}", common, variant])
    return section(
        "determinism",
        "Determinism",
        [
            "<p>Copies of the fixed prompt sent between the measured waves at each "
            f"{'batch size' if view.kind == 'ladder' else 'level'}: how many distinct answers "
            "came back, and where the first one differs (a token is a word here).</p>",
            table(
                "determinism-table",
                [view.key, "distinct", "first differing token", "most common", "variant"],
                cells,
                text_columns=("most common", "variant"),
            ),
        ],
    )


def timeline_html(timeline: Timeline) -> str:
    title = f"requests of {timeline.label} ({len(timeline.bars)})"
    return section(
        "timeline",
        f"Timeline: {timeline.label}",
        [
            "<p>One bar per request from start to finish, a black tick at its first token, "
            "failures in red; a staircase means requests waited.</p>",
            f'<p class="muted" id="timeline-source">times: {text(timeline.note)}</p>',
            timeline_chart(title, timeline.bars),
        ],
    )


def run_html(view: RunView, timeline: Timeline | None = None) -> str:
    """The whole report of one run as one HTML document, the answer first."""
    title = f"calibrate {view.kind}: {view.run_id}"
    parts = [
        f"<h1>{text(title)}</h1>",
        verdict_html(view),
        section("plots", "Plots", ['<div class="charts">', *charts_for([("", view)]), "</div>"]),
        section(
            "tier-table", "Tiers" if view.kind == "ladder" else "Levels", [tier_table_html(view)]
        ),
    ]
    if (fit := replay_fit(view.summary, view.path)) is not None:
        parts.append(replay_html(fit))
    if timeline is not None:
        parts.append(timeline_html(timeline))
    if (copies := determinism_html(view)) is not None:
        parts.append(copies)
    parts += [incidents_html(view), configuration_html(view)]
    return page(title, parts)
